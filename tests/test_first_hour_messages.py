"""A newcomer's first hour (issue 31): errors and forecasts that say what to fix, in words a person reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from shared.errors import invalid
from shared.models import RunCreate
from tests.harness import Harness

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


def _create(**training: object) -> dict[str, object]:
    return {"project_id": "p1", "provider": "local", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "dataset_id": "d1", "training": training}


def test_an_unknown_key_names_the_nearest_valid_one_and_lists_them() -> None:
    """`lr: Extra inputs are not permitted` said nothing of what to send instead."""
    with pytest.raises(ValidationError) as caught:
        RunCreate.model_validate(_create(lr=1e-4))
    err = invalid(caught.value, model=RunCreate)
    field = next(e for e in err.errors if e["field"] == "training.lr")
    assert "did you mean learning_rate?" in field["message"]
    assert "batch_size" in field["message"] and "learning_rate" in field["message"]
    assert "Extra inputs" not in err.detail
    # A near misspelling is found by its likeness; a key of the request itself lists the request's fields.
    with pytest.raises(ValidationError) as caught:
        RunCreate.model_validate({**_create(), "base_modle": "x"})
    top = invalid(caught.value, model=RunCreate).errors
    assert any(e["field"] == "base_modle" and "did you mean base_model?" in e["message"] for e in top)


# ---------------------------------------------------------------- the local provider's base models


def _local_draft(h: Harness, base_model: str) -> tuple[int, Any]:
    pid, dsid = h.project_and_dataset(rows=20)
    body = {"project_id": pid, "dataset_version_id": dsid, "provider": "local", "offer_id": "local-smoke",
            "base_model": base_model, "price_limit_per_hour": 1.0}
    status, got, _ = h.call("POST", "/api/runs", token="member", json_body=body)
    return status, got


def test_a_base_model_the_local_host_cannot_load_is_refused_at_create(
        h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2.5-0.5B was accepted on the local CPU with no hub access and failed a minute in: it is
    refused at create with what to do, and the base-models list no longer calls it trainable there."""
    monkeypatch.setenv("HOME", str(tmp_path))  # an empty Hugging Face cache
    h.save_compute("local", {})
    status, body = _local_draft(h, QWEN)
    assert status == 422, body
    err = body["errors"][0]
    assert err["field"] == "base_model" and "cannot be loaded on this host" in err["message"]
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in err["message"] and f"hf download {QWEN}" in err["message"]
    listed = {m["id"]: m for m in h.ok("GET", "/api/base-models", token="member")["items"]}
    assert listed[QWEN]["local_cpu"] is False and listed["tensorant/tiny-llama"]["local_cpu"] is True
    # Once in this host's cache (what `hf download` leaves) the trainer loads it without the hub: accepted.
    snapshot = tmp_path / ".cache/huggingface/hub" / f"models--{QWEN.replace('/', '--')}" / "snapshots/abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert _local_draft(h, QWEN)[0] == 201
    # A cloud provider fetches from the hub: not refused there.
    pid, dsid = h.project_and_dataset(rows=20)
    status, _, _ = h.call("POST", "/api/runs", token="member", json_body={
        "project_id": pid, "dataset_version_id": dsid, "provider": "memory", "offer_id": "mem-a10",
        "base_model": "Qwen/Qwen2.5-0.5B", "price_limit_per_hour": 10.0})
    assert status == 201


def test_a_model_over_the_local_cpu_cap_says_choose_a_smaller_model_or_a_gpu(h: Harness) -> None:
    """"lower batch_size or max_seq_len, or set load_in_4bit" cannot help an 8B model on the local CPU."""
    h.save_compute("local", {})
    status, body = _local_draft(h, "meta-llama/Llama-3.1-8B-Instruct")
    assert status == 422, body
    assert "too large for the local CPU provider" in body["detail"] and "GPU provider" in body["detail"]
    assert "load_in_4bit" not in body["detail"] and "batch_size" not in body["detail"]
