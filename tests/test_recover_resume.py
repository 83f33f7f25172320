"""`recover --resume` in the control plane: which providers may resume (declared by each provider),
the refusals, the start recorded before the cloud call, and a failed resume that keeps everything.

The agent's side (a restarted machine waiting for the resume, a failed resume reported with its
checkpoint as output) is in tests/test_agent_local.py; the local provider's resume end to end in
tests/e2e/test_checkpoints_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import CapacityError
from shared.providers import registry
from shared.services.api.runs import actions
from shared.store import get_store
from tests.fakes import Cloud, MemoryCompute
from tests.harness import Harness


def _retained(harness: Harness, *, checkpoint: bool) -> str:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.4)
    if checkpoint:
        agent.upload(b"the adapter of the checkpoint at step 40")  # the agent uploads each checkpoint's adapter
    agent.complete_failed("boom")
    assert harness.get_run(run_id)["state"] == "retained"
    return run_id


def test_the_providers_declare_resume_and_the_refusal_names_them(harness: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    assert registry.resumable_providers() == ["aws", "azure", "local", "runpod"]
    run_id = _retained(harness, checkpoint=True)
    started: list[Any] = []
    monkeypatch.setattr(MemoryCompute, "start", lambda self, ref, resources: started.append(ref))
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    assert status == 409, body
    assert "not available on memory (it is on aws, azure, local, runpod)" in body["detail"], body["detail"]
    assert "verify_saved" in body["detail"]
    assert harness.get_run(run_id)["state"] == "retained" and started == []


@pytest.fixture
def resumable(monkeypatch: Any) -> None:
    """The memory provider declared resumable, as a cloud provider's ProviderInfo does."""
    monkeypatch.setattr(actions, "resumes_training", lambda name: True)


def test_a_resume_without_a_checkpoint_is_refused_and_starts_nothing(harness: Harness, cloud: Cloud, resumable: None,
                                                                    monkeypatch: Any) -> None:
    run_id = _retained(harness, checkpoint=False)
    started: list[Any] = []
    monkeypatch.setattr(MemoryCompute, "start", lambda self, ref, resources: started.append(ref))
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    assert status == 409 and "nothing to resume from" in body["detail"], body
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and started == []


def test_the_start_is_recorded_before_the_cloud_call(harness: Harness, cloud: Cloud, resumable: None,
                                                    monkeypatch: Any) -> None:
    run_id = _retained(harness, checkpoint=True)
    seen: list[Any] = []

    def start_then_die(self: Any, ref: Any, resources: Any) -> Any:
        seen.append(get_store().runs.get(harness.org, run_id)[0])
        raise RuntimeError("the host died during the cloud call")  # not a cloud answer: a crash

    monkeypatch.setattr(MemoryCompute, "start", start_then_die)
    status, _, _ = harness.call("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    assert status == 500
    # What the cloud call found, and what a crash leaves: the machine shown started and billed as running
    # (heartbeat-check's idle stop stops it again), never a started machine billed as a stopped disk.
    assert seen[0].machine_started_at is not None and seen[0].billing.machine_running
    stored = get_store().runs.get(harness.org, run_id)[0]
    assert stored.state.value == "retained" and stored.machine_started_at is not None
    run = harness.get_run(run_id)
    assert any(e.get("data", {}).get("machine") == "started" for e in run["events"])


def test_a_refused_start_leaves_the_run_retained_and_billed_as_disk(harness: Harness, cloud: Cloud, resumable: None,
                                                                   monkeypatch: Any) -> None:
    run_id = _retained(harness, checkpoint=True)

    def no_gpu(self: Any, ref: Any, resources: Any) -> Any:
        raise CapacityError("no GPU on the host now")

    monkeypatch.setattr(MemoryCompute, "start", no_gpu)
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    assert status == 409 and "stays retained" in body["detail"], body
    stored = get_store().runs.get(harness.org, run_id)[0]
    assert stored.state.value == "retained" and stored.machine_started_at is None
    assert stored.billing is not None and not stored.billing.machine_running
    run = harness.get_run(run_id)
    assert any("did not start the machine" in e["message"] for e in run["events"])


def test_a_resume_that_fails_in_the_trainer_returns_the_run_to_retained(harness: Harness, cloud: Cloud,
                                                                       resumable: None) -> None:
    run_id = _retained(harness, checkpoint=True)
    run = harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    assert run["state"] == "training", run
    agent = harness.agent(run_id)
    assert agent.heartbeat("training", 0.4)["resume"] is True
    # The trainer crashed loading a corrupt checkpoint: the agent reports its checkpoints as output.
    harness.ok("POST", f"/api/agent/runs/{run_id}/complete", token=agent.token, json_body={
        "status": "failed", "reason": "could not load the checkpoint", "exit_code": 1, "output_exists": True})
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "retained", run["reason"]
    assert "could not load the checkpoint" in run["reason"] and "disk kept" in run["reason"]
