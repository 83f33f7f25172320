"""Base models named by Hub id and revision (shared/runs/hub_models.py, adapter_format/hub_config.py), against
the fake hub on loopback (tests/hub_fake.py): shapes derived from config.json, kept once per org, id and
commit, refusals at create with what to do, the fit, the machine's revision and the verifier."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adapter_format.base_models import BASE_MODELS
from adapter_format.hub_config import ConfigRefused, model_from_config, params_from_header
from tests.hub_fake import CONFIGS, PARAMS, FakeHub, fake_hub, sha_of

# A 70B Llama 3 (the published shapes): no 24 GiB offer holds it.
BIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "intermediate_size": 28672,
       "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
       "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


# ---------------------------------------------------------------- shapes from config.json (no store)


@pytest.mark.parametrize("model_id", sorted(CONFIGS))
def test_each_architecture_derives_its_published_parameter_count(model_id: str) -> None:
    """The shapes alone (no checkpoint count) give the published parameter count within 0.01 %: what is left
    is the norms the formula does not count (Qwen3's q/k norms, Gemma's extra norms)."""
    model = model_from_config(model_id, CONFIGS[model_id])
    assert abs(model.param_count() - PARAMS[model_id]) / PARAMS[model_id] < 1e-4, model.param_count()
    assert model.num_layers == CONFIGS[model_id]["num_hidden_layers"]
    assert model.vocab_size == CONFIGS[model_id]["vocab_size"]


@pytest.mark.parametrize("model_id", ["meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B",
                                      "HuggingFaceTB/SmolLM2-135M-Instruct"])
def test_derived_shapes_equal_the_declared_ones(model_id: str) -> None:
    got, declared = model_from_config(model_id, CONFIGS[model_id]), BASE_MODELS[model_id]
    assert got.modules == declared.modules
    assert got.param_count() == declared.param_count()
    assert got.estimate_memory() == declared.estimate_memory()


def test_gemma_and_qwen3_take_head_dim_from_the_config() -> None:
    gemma = model_from_config("google/gemma-2-2b", CONFIGS["google/gemma-2-2b"])
    assert gemma.architecture == "gemma2" and gemma.tie_embeddings  # Gemma ties without saying so
    assert gemma.modules["q_proj"] == (2304, 8 * 256) and gemma.modules["o_proj"] == (2048, 2304)
    qwen3 = model_from_config("Qwen/Qwen3-0.6B", CONFIGS["Qwen/Qwen3-0.6B"])
    assert qwen3.architecture == "qwen3" and not qwen3.attention_bias
    assert qwen3.modules["q_proj"] == (1024, 16 * 128) and qwen3.modules["k_proj"] == (1024, 8 * 128)


def test_phi3_fused_modules() -> None:
    phi = model_from_config("microsoft/Phi-3-mini-4k-instruct", CONFIGS["microsoft/Phi-3-mini-4k-instruct"])
    assert phi.modules == {"qkv_proj": (3072, 3 * 3072), "o_proj": (3072, 3072), "gate_up_proj": (3072, 2 * 8192),
                           "down_proj": (8192, 3072)}
    assert phi.targets("attention") == ("qkv_proj", "o_proj") == phi.default_targets
    assert phi.lora_params(8, phi.targets("all-linear")) == 32 * 8 * (3072 * 4 + 3072 * 2 + 3072 + 2 * 8192 + 8192 + 3072)


@pytest.mark.parametrize(("config", "says"), [
    ({**CONFIGS["meta-llama/Llama-3.2-1B"], "architectures": ["GPT2LMHeadModel"]}, "GPT2LMHeadModel is not supported"),
    ({"model_type": "llama"}, "no architectures"),
    ({**CONFIGS["meta-llama/Llama-3.2-1B"], "hidden_size": True}, "hidden_size must be an integer"),
    ({**CONFIGS["meta-llama/Llama-3.2-1B"], "num_hidden_layers": 10**9}, "num_hidden_layers must be an integer"),
    ({**CONFIGS["meta-llama/Llama-3.2-1B"], "num_key_value_heads": 7}, "not a multiple"),
    ({k: v for k, v in CONFIGS["meta-llama/Llama-3.2-1B"].items() if k != "vocab_size"}, "no vocab_size"),
])
def test_a_config_out_of_bounds_is_refused(config: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigRefused, match=says):
        model_from_config("x/y", config)


def test_safetensors_header_count() -> None:
    header = {"__metadata__": {}, "a": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24]},
              "b": {"dtype": "BF16", "shape": [5], "data_offsets": [24, 34]}}
    assert params_from_header(header) == 17
    assert params_from_header({"a": {"shape": [-1]}}) == 0


# ---------------------------------------------------------------- at create, against the fake hub


@pytest.fixture
def hub(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    from shared import settings

    with fake_hub() as served:
        monkeypatch.setenv("TENSORANT_HF_ENDPOINT", served.url)
        monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")  # test-only: the fake hub is loopback http
        settings.reset_settings()
        yield served


def _create(h: Any, base_model: str, revision: str | None) -> tuple[int, Any]:
    pid, dsid = h.project_and_dataset()
    status, body, _ = h.call("POST", "/api/runs", token="member", json_body={
        "project_id": pid, "dataset_version_id": dsid, "provider": "memory", "offer_id": "mem-a10",
        "base_model": base_model, "price_limit_per_hour": 100.0, "runtime_limit_s": 3600,
        **({"base_model_revision": revision} if revision is not None else {})})
    return status, body


@pytest.mark.parametrize("model_id", sorted(set(CONFIGS) - {"HuggingFaceTB/SmolLM2-135M-Instruct"}))
def test_each_supported_architecture_is_accepted_by_hub_id(hub: FakeHub, harness: Any, model_id: str) -> None:
    status, run = _create(harness, model_id, "main")
    assert status == 201, run
    from shared.store import get_store

    rec = get_store().runs.get(harness.org, run["id"])[0]
    assert rec.base_model_revision == sha_of(model_id)  # the branch resolved once, the commit recorded
    assert run["base_model_revision"] == sha_of(model_id)  # and shown in the run view
    kept = get_store().hub_models.get(harness.org, model_id, sha_of(model_id))
    assert kept is not None
    assert kept[0].param_count() == PARAMS[model_id]  # the checkpoint's own count (index or header)
    assert kept[0].num_layers == CONFIGS[model_id]["num_hidden_layers"]


def test_read_once_per_id_and_commit(hub: FakeHub, harness: Any) -> None:
    sha = sha_of("Qwen/Qwen3-0.6B")
    for revision in ("main", sha, "main"):
        status, body = _create(harness, "Qwen/Qwen3-0.6B", revision)
        assert status == 201, body
    assert hub.count("/config.json") == 1
    assert hub.count("/api/models/Qwen/Qwen3-0.6B/revision/main") == 2  # a branch is resolved at each create
    status, body = _create(harness, "Qwen/Qwen3-0.6B", "v1")  # another commit: read again
    assert status == 201, body
    assert hub.count("/config.json") == 2


def test_refusals_say_what_to_do(hub: FakeHub, harness: Any) -> None:
    hub.configs["acme/gpt2-fork"] = {**CONFIGS["meta-llama/Llama-3.2-1B"], "architectures": ["GPT2LMHeadModel"]}
    hub.configs["acme/llama-70b"] = BIG
    hub.params["acme/llama-70b"] = 70_553_706_496
    cases = [
        (("acme/gpt2-fork", "main"), "base_model", "GPT2LMHeadModel is not supported"),
        (("acme/nothing-here", "main"), "base_model", "check the id and the revision"),
        (("Qwen/Qwen3-0.6B", "no-such-branch"), "base_model", "check the id and the revision"),
        (("Qwen/Qwen3-0.6B", "0" * 40), "base_model", "check the id and the revision"),
        (("acme/llama-70b", "main"), "offer_id", "needs about"),
        (("acme/undeclared", None), "base_model", "base_model_revision"),
        (("Qwen/Qwen3-0.6B", "../x"), "base_model_revision", ""),
    ]
    for (model_id, revision), field, says in cases:
        status, body = _create(harness, model_id, revision)
        assert status == 422, (model_id, body)
        assert body["errors"][0]["field"] == field, body
        assert says in body["detail"], body


def test_gated_model_needs_the_orgs_token(hub: FakeHub, harness: Any) -> None:
    hub.gated["meta-llama/Llama-3.2-1B"] = "hf_right0123456789abcdefgh"
    status, body = _create(harness, "meta-llama/Llama-3.2-1B", "main")
    assert status == 422 and "an owner saves a Hugging Face token" in body["detail"], body
    harness.ok("PUT", "/api/org/secrets/huggingface-token", json_body={"token": "hf_wrong0123456789abcdefgh"})
    status, body = _create(harness, "meta-llama/Llama-3.2-1B", "main")
    assert status == 422 and "gated or private" in body["detail"], body
    assert "hf_wrong0123456789abcdefgh" not in str(body)
    harness.ok("PUT", "/api/org/secrets/huggingface-token", json_body={"token": "hf_right0123456789abcdefgh"})
    status, body = _create(harness, "meta-llama/Llama-3.2-1B", "main")
    assert status == 201, body
    assert ("/meta-llama/Llama-3.2-1B/resolve/" + sha_of("meta-llama/Llama-3.2-1B") + "/config.json",
            "Bearer hf_right0123456789abcdefgh") in hub.requests


def test_a_private_models_record_is_its_orgs_alone(hub: FakeHub, harness: Any) -> None:
    from shared.runs import hub_models

    sha = sha_of("Qwen/Qwen3-0.6B")
    status, body = _create(harness, "Qwen/Qwen3-0.6B", sha)
    assert status == 201, body
    assert hub_models.kept(harness.ctx, harness.org, "Qwen/Qwen3-0.6B", sha) is not None
    assert hub_models.kept(harness.ctx, "org-b", "Qwen/Qwen3-0.6B", sha) is None


def test_the_hub_endpoint_goes_through_the_guard(hub: FakeHub, harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared import settings

    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "0")
    settings.reset_settings()
    status, body = _create(harness, "Qwen/Qwen3-0.6B", sha_of("Qwen/Qwen3-0.6B"))
    assert status == 422 and "must be an https:// URL" in body["detail"], body
    assert "TENSORANT_HF_ENDPOINT" in body["detail"], body
    monkeypatch.setenv("TENSORANT_HF_ENDPOINT", hub.url.replace("http://", "https://"))
    settings.reset_settings()
    status, body = _create(harness, "Qwen/Qwen3-0.6B", sha_of("Qwen/Qwen3-0.6B"))
    assert status == 422 and "non-public address" in body["detail"], body
    assert hub.requests == []  # nothing reached the loopback


def test_machine_gets_the_commit_and_the_verifier_the_derived_shapes(hub: FakeHub, harness: Any, cloud: Any) -> None:
    from shared.runs import hub_models
    from tests.support.adapters import build_adapter_zip

    sha = sha_of("Qwen/Qwen3-0.6B")
    status, run = _create(harness, "Qwen/Qwen3-0.6B", "main")
    assert status == 201, run
    harness.launch(run["id"])
    (machine,) = cloud.machines.values()
    assert machine.env["TENSORANT_BASE_MODEL"] == "Qwen/Qwen3-0.6B"
    assert machine.env["TENSORANT_BASE_MODEL_REVISION"] == sha
    model = hub_models.kept(harness.ctx, harness.org, "Qwen/Qwen3-0.6B", sha)
    assert model is not None
    done = harness.agent(run["id"]).train(build_adapter_zip("Qwen/Qwen3-0.6B", r=2, trainer="lora", model=model))
    assert done is not None
    got = harness.get_run(run["id"])
    assert got["state"] == "succeeded", got


def test_an_adapter_of_other_shapes_is_refused_against_the_hub_record(hub: FakeHub, harness: Any, cloud: Any) -> None:
    from shared.runs import hub_models
    from tests.support.adapters import build_adapter_zip

    status, run = _create(harness, "Qwen/Qwen3-0.6B", "main")
    assert status == 201, run
    harness.launch(run["id"])
    model = hub_models.kept(harness.ctx, harness.org, "Qwen/Qwen3-0.6B", sha_of("Qwen/Qwen3-0.6B"))
    assert model is not None
    # Qwen2.5-0.5B's shapes under Qwen3-0.6B's name: the declared table knows neither id with these shapes.
    other = model_from_config("Qwen/Qwen3-0.6B", CONFIGS["Qwen/Qwen2.5-0.5B"])
    harness.agent(run["id"]).train(build_adapter_zip("Qwen/Qwen3-0.6B", r=2, trainer="lora", model=other))
    got = harness.get_run(run["id"])
    assert got["state"] != "succeeded", got
    assert "do not fit Qwen/Qwen3-0.6B" in str(got), got["reason"]


def test_merged_only_for_the_architectures_the_merged_verifier_knows(hub: FakeHub, harness: Any) -> None:
    pid, dsid = harness.project_and_dataset()
    base = {"project_id": pid, "dataset_version_id": dsid, "provider": "memory", "offer_id": "mem-a10",
            "price_limit_per_hour": 100.0, "runtime_limit_s": 3600, "base_model_revision": "main",
            "training": {"merged": True}}
    status, body, _ = harness.call("POST", "/api/runs", token="member", json_body={**base, "base_model": "Qwen/Qwen3-0.6B"})
    assert status == 422 and body["errors"][0]["field"] == "training.merged", body
    status, body, _ = harness.call("POST", "/api/runs", token="member", json_body={**base, "base_model": "Qwen/Qwen2.5-0.5B"})
    assert status == 201, body


def test_a_slow_hub_is_cut_at_the_read_bound(hub: FakeHub, harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from shared.runs import hub_models

    monkeypatch.setattr(hub_models, "HUB_READ_S", 0.3)  # every request of one create together
    hub.delay_s = 0.2  # each answer: the second request runs out of time
    started = time.monotonic()
    status, body = _create(harness, "Qwen/Qwen3-0.6B", "main")
    assert status == 422 and "the hub did not answer" in body["detail"], body
    assert time.monotonic() - started < 3


def test_cli_sends_the_revision_and_names_its_flag() -> None:
    from tensorant_cli.commands.runs import _run_create_body
    from tensorant_cli.main import build_parser
    from tensorant_cli.render import cli_words

    args = build_parser().parse_args(["runs", "create", "--project", "p1", "--dataset", "d1", "--provider", "aws",
                                      "--offer", "o1", "--base-model", "Qwen/Qwen3-0.6B", "--base-model-revision",
                                      "main", "--price-limit", "2"])
    body = _run_create_body(args, partial=False)
    assert body["base_model"] == "Qwen/Qwen3-0.6B" and body["base_model_revision"] == "main"
    assert cli_words("check base_model_revision") == "check --base-model-revision"
