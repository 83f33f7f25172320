"""training.merged through the real handlers: refused at create where the merged weights would not fit one
archive, the machine handed a place for merged.zip only when asked, the verify step keeping a merged model
only when adapter_format.merged passes it (the run succeeds either way, with merged_note saying why there is
none), and GET /api/runs/{id}/adapter?format=merged serving exactly the verified bytes."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from adapter_format.base_models import BASE_MODELS
from adapter_format.merged import expected_tensors
from shared.org_storage.base import merged_key
from tests.fakes import Cloud, TwoOffers, draft, serve_memory
from tests.harness import Harness, TestAgent, trained_adapter_zip

TINY = "tensorant/tiny-llama"
BIG = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """The memory provider for this module: the A10 and an H100."""
    yield from serve_memory(Cloud(), TwoOffers)


def safetensors(shapes: dict[str, tuple[int, ...]], nan: str = "") -> bytes:
    header: dict[str, Any] = {}
    blobs, at = [], 0
    for name, shape in shapes.items():
        data = np.zeros(shape, dtype="<f4")
        if name == nan:
            data.flat[0] = np.nan
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + data.nbytes]}
        blobs.append(data.tobytes())
        at += data.nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def merged_zip(base_model: str = TINY, nan: str = "") -> bytes:
    """A merged model archive as the machine exports one (all zeros: only its form is checked here)."""
    m = BASE_MODELS[base_model]
    files = {"config.json": json.dumps({"model_type": m.architecture, "hidden_size": m.hidden_size,
                                        "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
                                        "num_key_value_heads": m.num_kv_heads, "vocab_size": m.vocab_size,
                                        "intermediate_size": m.intermediate_size}).encode(),
             "model.safetensors": safetensors(expected_tensors(m), nan)}
    listed = {name: {"sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    files["manifest.json"] = json.dumps({"format": 1, "base_model": base_model, "files": listed}).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def train_merged(harness: Harness, run_id: str, merged: bytes | None) -> TestAgent:
    """The agent's export with training.merged: adapter.zip, then merged.zip, one completion naming both."""
    from shared.runs.org_backends import storage_for

    agent = harness.agent(run_id)
    for phase in ("preparing", "training", "exporting"):
        agent.heartbeat(phase, 1.0)
    adapter = trained_adapter_zip(base_model=TINY)
    agent.upload(adapter)
    body: dict[str, Any] = {"status": "ok", "sha256": hashlib.sha256(adapter).hexdigest(), "size": len(adapter)}
    if merged is not None:
        storage_for(harness.ctx, harness.org).put(merged_key(run_id), merged)
        body |= {"merged_sha256": hashlib.sha256(merged).hexdigest(), "merged_size": len(merged)}
    harness.ok("POST", f"/api/agent/runs/{run_id}/complete", token=agent.token, json_body=body)
    harness.drain()
    return agent


def test_merged_is_refused_at_create_where_the_merged_weights_do_not_fit_one_archive(harness: Harness) -> None:
    status, body = draft(harness, base_model=BIG, offer_id="mem-h100", training={"merged": True})
    assert status == 422 and [e["field"] for e in body["errors"]] == ["training.merged"], body
    assert "16.1 GB" in body["detail"] and "merge_and_unload" in body["detail"]
    assert draft(harness, base_model=BIG, offer_id="mem-h100")[0] == 201  # the same run without it
    status, body = draft(harness, training={"merged": "yes"})
    assert status == 422 and "training.merged" in [e["field"] for e in body["errors"]]


def test_the_machine_gets_a_place_for_merged_zip_only_when_asked(harness: Harness, cloud: Cloud) -> None:
    for merged in (False, True):
        _, run = draft(harness, training={"merged": merged})
        harness.launch(run["id"])
        (env,) = [m.env for m in cloud.machines.values() if m.tags.get("tensorant:run") == run["id"]]
        assert json.loads(env["TENSORANT_TRAINING"])["merged"] is merged
        assert (env.get("TENSORANT_MERGED_KEY") == merged_key(run["id"])) is merged


def test_a_verified_merged_model_is_served_and_a_replaced_one_is_not(harness: Harness) -> None:
    _, run = draft(harness, training={"merged": True})
    harness.launch(run["id"])
    merged = merged_zip()
    agent = train_merged(harness, run["id"], merged)
    done = harness.get_run(run["id"])
    assert done["state"] == "succeeded", done["reason"]
    assert (done["merged_sha256"], done["merged_size"], done["merged_note"]) == (
        hashlib.sha256(merged).hexdigest(), len(merged), "")
    assert any(e["message"] == "merged model verified" for e in done["events"])
    status, got, headers = harness.call("GET", f"/api/runs/{run['id']}/adapter", token="member", params={"format": "merged"})
    assert status == 200 and got == merged and headers["X-Adapter-Sha256"] == done["merged_sha256"]
    assert f"{run['id']}-merged.zip" in headers["Content-Disposition"]
    status, got, _ = harness.call("GET", f"/api/runs/{run['id']}/adapter", token="member")
    assert status == 200 and hashlib.sha256(got).hexdigest() == done["adapter_sha256"]  # the default: the adapter
    status, body, _ = harness.call("GET", f"/api/runs/{run['id']}/adapter", token="member", params={"format": "gguf"})
    assert status == 422 and body["errors"][0]["field"] == "format"
    from shared.runs.org_backends import storage_for

    storage_for(harness.ctx, harness.org).put(merged_key(agent.run_id), merged + b"tampered")
    status, body, _ = harness.call("GET", f"/api/runs/{run['id']}/adapter", params={"format": "merged"})
    assert status == 409 and "merged model has changed since it was verified" in body["detail"]


@pytest.mark.parametrize(("merged", "said"), [
    (merged_zip(nan="model.norm.weight"), "its verification failed: model.norm.weight holds 1 NaN"),
    (merged_zip(base_model="tensorant/tiny-qwen2"), "its verification failed: config.json has model_type"),
    (None, "the machine did not make one"),
])
def test_without_a_good_merged_model_the_run_succeeds_with_its_adapter_saying_why(
        harness: Harness, merged: bytes | None, said: str) -> None:
    _, run = draft(harness, training={"merged": True})
    harness.launch(run["id"])
    train_merged(harness, run["id"], merged)
    done = harness.get_run(run["id"])
    assert done["state"] == "succeeded" and done["merged_sha256"] == "", done
    assert said in done["merged_note"], done["merged_note"]
    assert any(e["kind"] == "warning" and said in e["message"] for e in done["events"])
    status, body, _ = harness.call("GET", f"/api/runs/{run['id']}/adapter", token="member", params={"format": "merged"})
    assert status == 404 and said in body["detail"], body


def test_a_run_that_did_not_ask_has_no_merged_model(harness: Harness) -> None:
    _, run = draft(harness)
    harness.launch(run["id"])
    harness.agent(run["id"]).train(trained_adapter_zip(base_model=TINY))
    status, body, _ = harness.call("GET", f"/api/runs/{run['id']}/adapter", token="member", params={"format": "merged"})
    assert status == 404 and "not asked for" in body["detail"] and "training.merged" in body["detail"]


def test_the_clis_status_block_says_where_the_merged_model_is_or_why_there_is_none() -> None:
    from tensorant_cli.render import status_block

    run = {"id": "r-1", "state": "succeeded", "training": {"merged": True}, "offer": {}, "merged_sha256": "ab" * 32,
           "merged_size": 538_000_000}
    assert "  merged model: verified (538 MB): tensorant runs download r-1 --merged" in status_block(run)
    note = "no merged model: its verification failed: model.norm.weight holds 1 NaN"
    assert f"  {note}" in status_block({**run, "merged_sha256": "", "merged_note": note})
    assert not any("merged" in line for line in status_block({**run, "training": {}}))
