"""Through the real handlers: the run's `training` settings, base models and the GPU fit
check, the write-only Hugging Face token, and the adapter download (409 until verified)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes import Cloud, TwoOffers, draft, serve_memory
from tests.harness import Harness, trained_adapter_zip

HF_SECRET = "hf_DoNotLeakThisToken0123456789abcdef"
NO_SECRETS = {"huggingface_token": {"set": False}, "mlflow": {"set": False}, "wandb": {"set": False}}
BIG = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """`cloud`, and so `harness`, serve an H100 too: a model too big for the A10 still fits one offer."""
    yield from serve_memory(Cloud(), TwoOffers)


def test_defaults_trial_bounds_and_full_runs(harness: Harness) -> None:
    status, run = draft(harness)
    assert status == 201, run
    t = run["training"]
    assert (t["lora_r"], t["lora_alpha"], t["target_modules"], t["learning_rate"]) == (16, 32, "attention", 2e-4)
    assert (t["kind"], t["max_examples"], t["max_steps"]) == ("trial", 64, 30)
    assert run["runtime_limit_s"] == 20 * 60  # the trial's short default
    assert any("trial run: trains on at most 64 of the dataset's 100 examples" in e["message"] for e in run["events"])
    # A user's smaller bounds win; a larger max_steps is capped for a trial.
    _, run = draft(harness, training={"max_steps": 5, "max_examples": 10})
    assert (run["training"]["max_steps"], run["training"]["max_examples"]) == (5, 10)
    _, run = draft(harness, training={"max_steps": 500})
    assert run["training"]["max_steps"] == 30
    status, run = draft(harness, kind="full", training={"lora_r": 8, "target_modules": "all-linear", "epochs": 2})
    assert status == 201, run
    t = run["training"]
    assert (t["kind"], t["max_examples"], t["max_steps"], t["lora_r"], t["epochs"]) == ("full", None, None, 8, 2.0)
    assert run["runtime_limit_s"] == 3600
    assert harness.get_run(run["id"])["training"] == t  # stored on the run


@pytest.mark.parametrize(("training", "field"), [
    ({"lora_r": 0}, "training.lora_r"),
    ({"lora_r": "16"}, "training.lora_r"),
    ({"learning_rate": 0.5}, "training.learning_rate"),
    ({"learning_rate": "0.001"}, "training.learning_rate"),
    ({"target_modules": "mlp"}, "training.target_modules"),
    ({"precision": "fp16"}, "training.precision"),
    ({"max_seq_len": 8}, "training.max_seq_len"),
    ({"load_in_4bit": "yes"}, "training.load_in_4bit"),
    ({"lora_rank": 8}, "training.lora_rank"),
    ({"kind": "full"}, "training.kind"),  # the run is a trial
])
def test_bad_training_field_is_422_naming_it(harness: Harness, training: dict[str, Any], field: str) -> None:
    status, body = draft(harness, training=training)
    assert status == 422, body
    assert field in [e["field"] for e in body["errors"]], body


def test_base_models_listing(harness: Harness) -> None:
    items = {m["id"]: m for m in harness.ok("GET", "/api/base-models", token="member")["items"]}
    for name in ("HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
                 BIG, "mistralai/Mistral-7B-Instruct-v0.3"):
        assert name in items
    smol = items["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert 130e6 < smol["params"] < 140e6 and smol["layers"] == 30 and smol["hidden"] == 576
    assert smol["local_cpu"] is True and items[BIG]["local_cpu"] is False
    big = items[BIG]["memory_gb"]
    assert big["four_bit"] < big["bf16"] and 16 < big["bf16"] < 80


def test_undeclared_model_and_an_offer_too_small_are_refused(harness: Harness) -> None:
    status, body = draft(harness, base_model="gpt2")
    assert status == 422 and body["errors"][0]["field"] == "base_model"
    assert "tensorant/tiny-llama" in body["errors"][0]["message"]  # lists the declared ids
    # (At 4 x 1024 tokens an 8B model fits 24 GB in bf16 since the loss never holds the full logits.)
    status, body = draft(harness, base_model=BIG, training={"max_seq_len": 4096})
    assert status == 422, body
    err = body["errors"][0]
    assert err["field"] == "offer_id" and err["eligible_offer_ids"] == ["mem-h100"]
    assert err["memory_needed_gb"] > 24 and "mem-h100" in body["detail"]
    # The same model in 4-bit fits the 24 GB card; a huge batch at a long length fits nothing.
    assert draft(harness, base_model=BIG, training={"max_seq_len": 4096, "load_in_4bit": True})[0] == 201
    status, body = draft(harness, base_model=BIG, offer_id="mem-h100", training={"batch_size": 64, "max_seq_len": 8192})
    assert status == 422 and body["errors"][0]["eligible_offer_ids"] == []
    # The catalog says which offers fit.
    offers = {o["offer_id"]: o for o in harness.ok("GET", "/api/catalog/gpus",
                                            params={"provider": "memory", "base_model": BIG})["items"]}
    # The catalog judges the default settings (4 x 1024 tokens): the 8B model fits both cards.
    assert (offers["mem-a10"]["fits"], offers["mem-h100"]["fits"]) == (True, True)
    assert 16 < offers["mem-a10"]["memory_needed_gb"] < 24 < err["memory_needed_gb"]
    assert "fits" not in harness.ok("GET", "/api/catalog/gpus", params={"provider": "memory"})["items"][0]
    status, body, _ = harness.call("GET", "/api/catalog/gpus", params={"provider": "memory", "base_model": "nope"})
    assert status == 422 and body["errors"][0]["field"] == "base_model"


def test_local_offers_fit_small_models_only(harness: Harness) -> None:
    harness.save_compute("local", {})
    offers = harness.ok("GET", "/api/catalog/gpus", params={"provider": "local", "base_model": BIG})["items"]
    assert [o["fits"] for o in offers] == [False] and "CPU" in offers[0]["fit_note"]
    offers = harness.ok("GET", "/api/catalog/gpus",
                  params={"provider": "local", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"})["items"]
    assert [o["fits"] for o in offers] == [True]
    status, body = draft(harness, provider="local", offer_id="local-smoke", training={"load_in_4bit": True})
    assert status == 422 and "CUDA" in body["errors"][0]["message"]


def test_test_models_only_on_local_unless_the_test_setting_allows_them(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """tensorant/* models have no weights on the hub: a cloud run is refused them (create and a draft's
    edit) with the models to use instead; the local provider builds them and still accepts them."""
    from shared.settings import reset_settings

    allowed_draft = draft(harness, base_model="tensorant/smoke-tiny")[1]["id"]  # the conftest's test setting is on
    monkeypatch.setenv("TENSORANT_ALLOW_TEST_MODELS", "0")
    reset_settings()
    status, body = draft(harness, base_model="tensorant/smoke-tiny")
    assert status == 422, body
    err = body["errors"][0]
    assert err["field"] == "base_model" and "tensorant/smoke-tiny is a test model" in err["message"]
    assert "local provider" in err["message"] and "HuggingFaceTB/SmolLM2-135M-Instruct" in err["message"]
    assert "tensorant/tiny-llama" not in err["message"]  # only real models are suggested
    assert draft(harness, base_model="tensorant/tiny-qwen2")[0] == 422
    assert draft(harness, base_model="HuggingFaceTB/SmolLM2-135M-Instruct")[0] == 201
    # A draft's edit is checked the same way: naming a test model, or moving a test model's draft to a cloud.
    real = draft(harness, base_model="HuggingFaceTB/SmolLM2-135M-Instruct")[1]["id"]
    status, body, _ = harness.call("PATCH", f"/api/runs/{real}", token="member", json_body={"base_model": "tensorant/tiny-llama"})
    assert status == 422 and body["errors"][0]["field"] == "base_model"
    status, body, _ = harness.call("PATCH", f"/api/runs/{allowed_draft}", token="member", json_body={"offer_id": "mem-h100"})
    assert status == 422 and body["errors"][0]["field"] == "base_model"
    # Local builds the test models (random weights): accepted there.
    harness.save_compute("local", {})
    status, run = draft(harness, provider="local", offer_id="local-smoke", base_model="tensorant/smoke-tiny")
    assert status == 201, run
    status, body, _ = harness.call("PATCH", f"/api/runs/{run['id']}", token="member",
                             json_body={"base_model": "tensorant/tiny-llama"})
    assert status == 200, body


def test_test_models_are_not_offered_unless_the_operator_allows_them(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The base-model list (the API's, so the CLI's and the console's) and the lists in errors name the
    test models only under TENSORANT_ALLOW_TEST_MODELS."""
    from shared.settings import reset_settings

    listed = [m["id"] for m in harness.ok("GET", "/api/base-models", token="member")["items"]]
    assert "tensorant/smoke-tiny" in listed  # the conftest's test setting is on
    monkeypatch.setenv("TENSORANT_ALLOW_TEST_MODELS", "0")
    reset_settings()
    listed = [m["id"] for m in harness.ok("GET", "/api/base-models", token="member")["items"]]
    assert listed and not [m for m in listed if m.startswith("tensorant/")]
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in listed
    status, body = draft(harness, base_model="no/such-model")
    assert status == 422 and "HuggingFaceTB/SmolLM2-135M-Instruct" in body["detail"]
    assert "tensorant/" not in body["detail"]


def test_hf_token_is_write_only_owner_only_and_reaches_only_the_bootstrap(
        harness: Harness, cloud: Cloud, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    assert harness.ok("GET", "/api/org/secrets") == NO_SECRETS
    status, _, _ = harness.call("PUT", "/api/org/secrets/huggingface-token", token="member", json_body={"token": HF_SECRET})
    assert status == 403
    status, bad, _ = harness.call("PUT", "/api/org/secrets/huggingface-token", json_body={"token": "hf bad\n" + HF_SECRET})
    assert status == 422 and bad["errors"][0]["field"] == "token"
    saved = harness.ok("PUT", "/api/org/secrets/huggingface-token", json_body={"token": HF_SECRET})
    assert saved == {"huggingface_token": {"set": True}, "mlflow": {"set": False}, "wandb": {"set": False}}
    shown = harness.ok("GET", "/api/org/secrets")
    assert shown == {"huggingface_token": {"set": True}, "mlflow": {"set": False}, "wandb": {"set": False}}
    from shared.store import get_store

    rec = get_store().secrets.get("org-a", "huggingface-token")
    assert rec is not None and HF_SECRET not in rec.model_dump_json()
    # Sealed for this org: the blob copied to another org's row does not open.
    from shared.security import SealedSecretError
    from shared.services.api import org_secrets

    get_store().secrets.put(rec.model_copy(update={"org": "org-b"}))
    with pytest.raises(SealedSecretError):
        org_secrets.hf_token(harness.ctx, "org-b")

    _, run = draft(harness)
    launched = harness.launch(run["id"])
    (machine,) = cloud.machines.values()
    assert machine.env["HF_TOKEN"] == HF_SECRET  # handed to the machine, for the trainer
    assert json.loads(machine.env["TENSORANT_TRAINING"]) == run["training"]
    from shared.log import get_logger

    get_logger().info(f"something echoed {HF_SECRET}")
    out = capsys.readouterr()
    events = harness.ok("GET", f"/api/runs/{run['id']}")
    everything = json.dumps([saved, shown, bad, run, launched, events]) + caplog.text + out.out + out.err
    assert HF_SECRET not in everything
    status, _, _ = harness.call("DELETE", "/api/org/secrets/huggingface-token")
    assert status == 204
    assert harness.ok("GET", "/api/org/secrets") == NO_SECRETS


def test_adapter_is_409_until_succeeded_then_streamed_with_its_sha(harness: Harness) -> None:
    _, run = draft(harness)
    status, body, _ = harness.call("GET", f"/api/runs/{run['id']}/adapter", token="member")
    assert status == 409 and "draft" in body["detail"]
    harness.launch(run["id"])
    agent = harness.agent(run["id"])
    agent.heartbeat("training", 0.5)
    status, body, _ = harness.call("GET", f"/api/runs/{run['id']}/adapter")
    assert status == 409 and "training" in body["detail"]
    data = trained_adapter_zip(base_model="tensorant/tiny-llama")
    agent.train(data)
    assert harness.get_run(run["id"])["state"] == "succeeded"
    status, got, headers = harness.call("GET", f"/api/runs/{run['id']}/adapter", token="member")
    assert status == 200 and got == data
    assert headers["Content-Type"] == "application/zip"
    assert headers["X-Adapter-Sha256"] == hashlib.sha256(data).hexdigest()
    # Bytes changed in storage after verification are never served.
    agent.upload(data + b"tampered")
    status, body, _ = harness.call("GET", f"/api/runs/{run['id']}/adapter")
    assert status == 409 and "changed since it was verified" in body["detail"]


def test_bootstrap_carries_the_resolved_training_json(harness: Harness, cloud: Cloud) -> None:
    _, run = draft(harness, training={"lora_r": 4, "seed": 7})
    harness.launch(run["id"])
    (machine,) = cloud.machines.values()
    sent = json.loads(machine.env["TENSORANT_TRAINING"])
    assert sent["lora_r"] == 4 and sent["seed"] == 7 and sent["kind"] == "trial" and sent["max_steps"] == 30
    assert "HF_TOKEN" not in machine.env  # none saved
    # The trainer parses exactly what the control plane sends.
    from machine.trainer.config import parse_settings

    parsed, warnings = parse_settings(machine.env["TENSORANT_TRAINING"])
    assert warnings == [] and parsed.lora_r == 4 and parsed.max_examples == 64



def test_cli_training_flags_and_new_subcommands_parse() -> None:
    from tensorant_cli.commands.base_models import cmd_base_models
    from tensorant_cli.commands.runs import cmd_runs_download, training_from
    from tensorant_cli.main import build_parser

    args = build_parser().parse_args([
        "runs", "create", "--project", "p", "--dataset", "d", "--provider", "local", "--offer", "local-smoke",
        "--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--price-limit", "1",
        "--training-json", '{"lora_r": 8, "precision": "fp32"}', "--set-training", "max_steps=20",
        "--set-training", "target_modules=all-linear", "--set-training", "lora_r=4"])
    assert training_from(args) == {"lora_r": 4, "precision": "fp32", "max_steps": 20, "target_modules": "all-linear"}
    dl = build_parser().parse_args(["runs", "download", "r-1", "-o", "out.zip"])
    assert (dl.fn, dl.id, dl.output) == (cmd_runs_download, "r-1", "out.zip")
    assert build_parser().parse_args(["base-models"]).fn is cmd_base_models


@pytest.mark.parametrize("token", ["00000000", "abcdefgh-ijkl", "hf_short", "hf_" + "a" * 19])
def test_an_hf_token_must_look_like_one(harness: Harness, token: str) -> None:
    # A common string saved as a "token" would be masked in every log line and error text from then on.
    status, body, _ = harness.call("PUT", "/api/org/secrets/huggingface-token", json_body={"token": token})
    assert status == 422 and body["errors"][0]["field"] == "token", body


def test_a_forecast_without_saving_matches_the_create(harness: Harness) -> None:
    """POST /api/runs/forecast: the create's checks and forecast, nothing saved, the rate limit untouched."""
    pid, dsid = harness.project_and_dataset(rows=100)
    body = {"project_id": pid, "dataset_version_id": dsid, "provider": "memory", "offer_id": "mem-a10",
            "base_model": "tensorant/tiny-llama", "price_limit_per_hour": 10.0, "kind": "full"}
    for _ in range(12):  # more than the default runs_per_minute: a form asks at every change
        got = harness.ok("POST", "/api/runs/forecast", token="member", json_body=body)
    assert harness.ok("GET", "/api/runs", token="member")["items"] == []
    run = harness.ok("POST", "/api/runs", token="member", json_body=body)
    assert got["forecast"] == run["forecast"] and got["runtime_limit_s"] == run["runtime_limit_s"]
    assert got["offer"]["offer_id"] == "mem-a10" and got["warnings"] == run["warnings"]
    assert got["max_cost"] == pytest.approx(run["offer"]["total_per_hour"] * run["runtime_limit_s"] / 3600, abs=1e-3)
    # A price limit under the offer's price: the same warning the draft would carry.
    low = harness.ok("POST", "/api/runs/forecast", token="member", json_body={**body, "price_limit_per_hour": 0.01})
    assert any("above the price limit" in w for w in low["warnings"])
    status, bad, _ = harness.call("POST", "/api/runs/forecast", token="member", json_body={**body, "offer_id": "nope"})
    assert status in (404, 422) and "offer" in json.dumps(bad)
