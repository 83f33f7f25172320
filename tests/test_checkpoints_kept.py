"""Kept checkpoints (issue 42.4): the agent keeps the newest training.keep_checkpoints checkpoint adapters in a
ring of storage slots and reports them; GET /api/runs/{id}/checkpoints lists them, ?checkpoint=<step> downloads
one (only the archive the agent reported for that step), and a retained run recovers with a named one."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from adapter_format.smoke import build_adapter_files
from machine.agent.config import AgentConfig
from machine.agent.uploads import KEPT_FILE, Uploads
from shared.org_storage.base import checkpoint_key
from tests.fakes import Cloud
from tests.harness import SMOKE_MODEL, ApiError, Harness
from tests.test_checkpoint_recovery import checkpoint_zip

# ---------------------------------------------------------------- the agent's ring of slots

def _uploads(tmp_path: Path, keep: int) -> Uploads:
    keys = json.dumps([checkpoint_key("run-k", i) for i in range(keep)])
    cfg = AgentConfig(run_id="run-k", api_url="http://127.0.0.1:9", token="t", base_model=SMOKE_MODEL,
                      data_dir=tmp_path / "data", trainer_command="true", storage_dir=str(tmp_path / "storage"),
                      adapter_key="runs/run-k/adapter.zip", checkpoint_keys=keys)
    (tmp_path / "data").mkdir(exist_ok=True)
    return Uploads(cfg, lambda _line: None, output=tmp_path / "out", logs_path=tmp_path / "data" / "logs.txt")


def _checkpoint_folder(tmp_path: Path, step: int) -> Path:
    folder = tmp_path / "data" / "checkpoint" / f"step-{step:06d}"
    folder.mkdir(parents=True)
    files = build_adapter_files(SMOKE_MODEL)
    files["manifest.json"] = json.dumps(json.loads(files["manifest.json"]) | {"checkpoint_step": step}).encode()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "trainer_state.pt").write_bytes(b"optimizer state stays on the disk")
    return folder


def _step_in(path: Path) -> int:
    with zipfile.ZipFile(path) as z:
        assert "trainer_state.pt" not in z.namelist()
        return int(json.loads(z.read("manifest.json"))["checkpoint_step"])


def test_the_agent_keeps_the_newest_n_in_storage_and_after_a_restart(tmp_path: Path) -> None:
    up = _uploads(tmp_path, keep=3)
    for step in (10, 20, 30, 40):
        up.upload_checkpoint(_checkpoint_folder(tmp_path, step), train_loss=1.0 / step, eval_loss=None)
    slots = sorted((tmp_path / "storage" / "runs" / "run-k" / "checkpoints").iterdir())
    assert [p.name for p in slots] == ["slot-0.zip", "slot-1.zip", "slot-2.zip"]  # never more than keep
    assert sorted(_step_in(p) for p in slots) == [20, 30, 40]  # 40 replaced the oldest, 10
    assert [k["step"] for k in up.kept] == [20, 30, 40]
    for k in up.kept:
        stored = tmp_path / "storage" / checkpoint_key("run-k", int(str(k["slot"])))
        assert _step_in(stored) == k["step"]
        assert hashlib.sha256(stored.read_bytes()).hexdigest() == k["sha256"] and stored.stat().st_size == k["size"]
    assert up.kept[-1]["train_loss"] == pytest.approx(1 / 40) and "eval_loss" not in up.kept[-1]

    # An agent started again on the same disk continues the ring where it was (its list is on the disk).
    again = _uploads(tmp_path, keep=3)
    assert [k["step"] for k in again.kept] == [20, 30, 40]
    again.upload_checkpoint(_checkpoint_folder(tmp_path, 50))
    assert [k["step"] for k in again.kept] == [30, 40, 50]
    assert sorted(_step_in(p) for p in slots) == [30, 40, 50]
    assert json.loads((tmp_path / "data" / KEPT_FILE).read_text()) == again.kept


def test_the_agent_keeps_nothing_without_slots(tmp_path: Path) -> None:
    up = _uploads(tmp_path, keep=1)
    up.config.__dict__["checkpoint_keys"] = ""  # an older control plane hands out no slots
    up.upload_checkpoint(_checkpoint_folder(tmp_path, 10))
    assert up.kept == [] and not (tmp_path / "storage" / "runs" / "run-k" / "checkpoints").exists()
    assert (tmp_path / "storage" / "runs" / "run-k" / "adapter.zip").is_file()  # the recovery archive as before


def test_local_storage_hands_the_agent_one_key_per_kept_checkpoint(harness: Harness) -> None:
    from shared.runs.org_backends import storage_for

    env, _ = storage_for(harness.ctx, harness.org).agent_env("run-x", "datasets/p/d.jsonl", checkpoints=3)
    if "TENSORANT_CHECKPOINT_KEYS" in env:
        assert json.loads(env["TENSORANT_CHECKPOINT_KEYS"]) == [checkpoint_key("run-x", i) for i in range(3)]
    else:
        assert len(json.loads(env["TENSORANT_CHECKPOINT_UPLOAD_URLS"])) == 3
    env, _ = storage_for(harness.ctx, harness.org).agent_env("run-x", "datasets/p/d.jsonl")
    assert not {"TENSORANT_CHECKPOINT_KEYS", "TENSORANT_CHECKPOINT_UPLOAD_URLS"} & set(env)


# ---------------------------------------------------------------- the API

def _report(harness: Harness, run_id: str, kept: list[dict[str, Any]]) -> Any:
    from shared.security import mint_agent_token

    return harness.ok("POST", f"/api/agent/runs/{run_id}/heartbeat", token=mint_agent_token(harness.org, run_id),
                json_body={"phase": "training", "progress": 0.0002, "logs": [], "checkpoints": kept})


def _save(harness: Harness, run_id: str, step: int, slot: int, **losses: float) -> dict[str, Any]:
    from shared.runs.org_backends import storage_for

    data = checkpoint_zip(step)
    storage_for(harness.ctx, harness.org).put(checkpoint_key(run_id, slot), data)
    return {"step": step, "slot": slot, "saved_at": "2026-12-06T04:00:00Z", "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), **losses}


def _training_run(harness: Harness, keep: int = 2) -> str:
    run_id = harness.create_run("memory", "mem-a10", training={"keep_checkpoints": keep})
    harness.launch(run_id)
    return run_id


def test_keep_checkpoints_is_bounded_at_create(harness: Harness) -> None:
    with pytest.raises(ApiError) as e:
        harness.create_run("memory", "mem-a10", training={"keep_checkpoints": 11})
    assert e.value.status in (400, 422) and "keep_checkpoints" in json.dumps(e.value.body)


def test_list_and_download_the_kept_checkpoints(harness: Harness) -> None:
    run_id = _training_run(harness, keep=2)
    assert harness.ok("GET", f"/api/runs/{run_id}/checkpoints")["checkpoints"] == []
    first = _save(harness, run_id, 20, 0, train_loss=1.5)
    second = _save(harness, run_id, 40, 1, train_loss=1.2, eval_loss=1.3)
    # A slot past keep_checkpoints is not the run's: dropped.
    stray = _save(harness, run_id, 60, 1, train_loss=1.0) | {"slot": 5}
    _report(harness, run_id, [second, first, stray])
    listed = harness.ok("GET", f"/api/runs/{run_id}/checkpoints", token="member")
    assert listed["keep_checkpoints"] == 2
    assert [(c["step"], c["train_loss"], c["eval_loss"], c["size"]) for c in listed["checkpoints"]] == [
        (20, 1.5, None, first["size"]), (40, 1.2, 1.3, second["size"])]
    assert all("slot" not in c and c["saved_at"] for c in listed["checkpoints"])

    status, body, headers = harness.call("GET", f"/api/runs/{run_id}/adapter", params={"checkpoint": "20"})
    assert status == 200 and headers["X-Adapter-Sha256"] == first["sha256"]
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        assert json.loads(z.read("manifest.json"))["checkpoint_step"] == 20
    assert "20" in headers["Content-Disposition"]

    # A step not kept, and a step that is not a number.
    status, body, _ = harness.call("GET", f"/api/runs/{run_id}/adapter", params={"checkpoint": "30"})
    assert status == 404 and "20, 40" in body["detail"]
    status, body, _ = harness.call("GET", f"/api/runs/{run_id}/adapter", params={"checkpoint": "2x"})
    assert status in (400, 422) and "checkpoint" in json.dumps(body)
    # Another org's user cannot list it (the run is not found in theirs) and no token gets nothing.
    status, _, _ = harness.call("GET", f"/api/runs/{run_id}/checkpoints", token=None)
    assert status == 401

    # The agent put a newer checkpoint in slot 0 and died before reporting it: step 20 is no longer served.
    _save(harness, run_id, 60, 0)
    status, body, _ = harness.call("GET", f"/api/runs/{run_id}/adapter", params={"checkpoint": "20"})
    assert status == 409 and "replaced" in body["detail"]


def test_recover_a_named_checkpoint(harness: Harness, cloud: Cloud) -> None:
    run_id = _training_run(harness, keep=3)
    kept = [_save(harness, run_id, step, slot, train_loss=2.0 - slot) for slot, step in enumerate((20, 40, 60))]
    _report(harness, run_id, kept)
    from shared.security import mint_agent_token

    harness.ok("POST", f"/api/agent/runs/{run_id}/complete", token=mint_agent_token(harness.org, run_id),
         json_body={"status": "failed", "reason": "the runtime limit stopped the trainer", "exit_code": 1})
    harness.drain()
    assert harness.get_run(run_id)["state"] == "retained"

    # Resume continues only from the newest (the one on the machine's disk).
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume", "checkpoint": 40})
    assert status == 409 and "newest kept checkpoint (60)" in body["detail"]
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/recover",
                             json_body={"mode": "start_machine", "checkpoint": 40})
    assert status in (400, 422) and "checkpoint" in json.dumps(body)
    assert harness.get_run(run_id)["state"] == "retained"  # nothing changed by the refusals

    harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "verify_saved", "checkpoint": 40})
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded", run
    assert (run["adapter_kind"], run["checkpoint_step"]) == ("checkpoint", 40)
    assert run["adapter_sha256"] == kept[1]["sha256"]
    status, body, _ = harness.call("GET", f"/api/runs/{run_id}/adapter")
    assert status == 200 and hashlib.sha256(body).hexdigest() == kept[1]["sha256"]


def test_the_agent_reads_the_losses_a_checkpoint_is_listed_with(tmp_path: Path) -> None:
    from machine.agent.agent import Agent

    (tmp_path / "data").mkdir()
    agent = Agent(AgentConfig(run_id="run-k", api_url="http://127.0.0.1:9", token="t", base_model=SMOKE_MODEL,
                              data_dir=tmp_path / "data", trainer_command="true"), environ={})
    agent._read_output(io.BytesIO(b"progress=0.1000 step=2 loss=2.5000 lr=0.0002\n"
                                  b"eval step=2 eval_loss=2.7500\n"
                                  b"progress=0.2000 step=4 loss=2.2500 lr=0.0002\n"
                                  b"checkpoint step=4\n"))
    assert (agent.last_loss, agent.last_eval_loss, agent.checkpoint_seen) == (2.25, 2.75, 4)
    agent._read_output(io.BytesIO(b"a line saying loss=9 is not a progress line\n"))
    assert agent.last_loss == 2.25
    assert agent.kept_checkpoints() == []  # nothing kept yet: heartbeats carry no list


def test_the_trainer_never_sees_the_slot_or_validation_urls(tmp_path: Path) -> None:
    from machine.agent.agent import Agent

    slots = ["https://bucket.example/runs/r/checkpoints/slot-0.zip?X-Amz-Signature=aaaa"]
    valid = "https://bucket.example/datasets/p/v.jsonl?X-Amz-Signature=bbbb"
    environ = {"TENSORANT_CHECKPOINT_UPLOAD_URLS": json.dumps(slots), "TENSORANT_EVAL_DATASET_URL": valid, "PATH": "/bin"}
    (tmp_path / "data").mkdir()
    config = AgentConfig.from_env({"TENSORANT_RUN_ID": "run-k", "TENSORANT_API_URL": "http://127.0.0.1:9",
                                   "TENSORANT_RUN_TOKEN": "t", "TENSORANT_DATA_DIR": str(tmp_path / "data"),
                                   **environ})
    agent = Agent(config, environ=environ)
    env = agent.trainer_env(tmp_path / "data" / "dataset.jsonl", tmp_path / "out")
    assert not {"TENSORANT_CHECKPOINT_UPLOAD_URLS", "TENSORANT_EVAL_DATASET_URL"} & set(env)
    assert not any("X-Amz-Signature" in v for v in env.values())
    assert {slots[0], valid} <= set(config.secrets())  # masked in every forwarded line
