"""Cancel in every state, completion edge cases, stuck verification,
release without an outcome, recovery start errors. Real handlers, Azurite, the memory provider."""

from __future__ import annotations

from typing import Any

import pytest

from shared.models import RunState
from shared.store import get_store
from tests.fakes import Cloud, MemoryCompute
from tests.harness import Harness, smoke_adapter_zip


def queued_run(harness: Harness) -> str:
    """A launched run whose launch message has not been handled yet."""
    run_id = harness.create_run("memory", "mem-a10")
    harness.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    assert harness.get_run(run_id)["state"] == "queued"
    return run_id


def test_cancel_keep_disk_on_a_queued_run_cancels_it(harness: Harness, cloud: Cloud) -> None:
    # queued -> retaining is not in the table: this used to answer 500 (IllegalTransition).
    run_id = queued_run(harness)
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": False})
    assert status == 202, body
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "cancelled", run
    assert not cloud.machines and not harness.step_errors


def test_cancel_racing_the_launch_step_is_not_lost(harness: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    # The user reads the run as queued; the launch step moves it to provisioning and creates
    # the machine before the cancel writes. The cancel must still take effect.
    run_id = queued_run(harness)
    store = get_store()
    real_get_run = store.runs.get

    def get_run_then_launch(org: str, rid: str) -> Any:
        got = real_get_run(org, rid)
        monkeypatch.setattr(store.runs, "get", real_get_run)
        harness.drain()  # the launch step runs meanwhile
        return got

    monkeypatch.setattr(store.runs, "get", get_run_then_launch)
    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": True})
    harness.drain()
    assert harness.get_run(run_id)["state"] == "cancelled"
    assert len(cloud.machines) == 1 and not cloud.live()


@pytest.mark.parametrize("discard", [True, False])
def test_cancel_in_each_machine_state(harness: Harness, cloud: Cloud, discard: bool) -> None:
    for state in ("provisioning", "training", "verifying", "retained"):
        run_id = harness.create_run("memory", "mem-a10")
        harness.launch(run_id)
        a = harness.agent(run_id)
        if state == "training":
            a.heartbeat("training", 0.2)
        elif state == "verifying":
            import hashlib

            data = smoke_adapter_zip()
            a.upload(data)
            harness.ok("POST", f"/api/agent/runs/{run_id}/complete", token=a.token, json_body={
                "status": "ok", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
            assert harness.get_run(run_id)["state"] == "verifying"  # not drained: cancel comes first
        elif state == "retained":
            a.complete_failed("boom")
        status, body, _ = harness.call("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": discard})
        harness.drain()
        run = harness.get_run(run_id)
        if discard:
            assert status == 202 and run["state"] == "cancelled", (state, run)
        elif state == "retained":
            assert status == 409 and "discard: true" in body["detail"]
        else:
            assert status == 202 and run["state"] == "retained", (state, run)
    assert not harness.step_errors


def test_failed_completion_while_provisioning_retains(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).complete_failed("image pull failed", exit_code=125)
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and "exit code 125" in run["reason"]
    [m] = cloud.machines.values()
    assert m.state == "stopped" and m.disk_exists


def _break_storage(monkeypatch: Any) -> None:
    from shared.org_storage.local import LocalStorage

    def unreachable(self: Any, key: str, *args: int) -> Any:
        raise OSError("storage account unreachable")

    # The verify step streams the archive from an offset (open_range); other readers stream it (open_stream)
    # or take it whole (get).
    monkeypatch.setattr(LocalStorage, "get", unreachable)
    monkeypatch.setattr(LocalStorage, "open_stream", unreachable)
    monkeypatch.setattr(LocalStorage, "open_range", unreachable)


def test_verification_that_keeps_failing_stops_the_machine(harness: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    # verify-adapter poisons (storage keeps erroring): heartbeat-check re-sends it, but the
    # machine of a run in verifying must not bill forever.
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    _break_storage(monkeypatch)
    harness.agent(run_id).train(smoke_adapter_zip())
    assert harness.get_run(run_id)["state"] == "verifying"
    for _ in range(12):  # an hour of heartbeat-check ticks
        harness.clock.advance(301)
        harness.tick("heartbeat_check")
        harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "retained", run
    assert "storage account unreachable" in run["reason"]
    [m] = cloud.machines.values()
    assert m.state == "stopped" and m.disk_exists
    # Storage works again: recovering the saved adapter succeeds.
    monkeypatch.undo()
    assert harness.recover(run_id)["state"] == "succeeded"


def test_recovery_whose_verification_keeps_failing_returns_to_retained(
        harness: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).complete_failed("boom")
    _break_storage(monkeypatch)
    assert harness.recover(run_id)["state"] == "recovering"
    for _ in range(12):
        harness.clock.advance(301)
        harness.tick("heartbeat_check")
        harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "retained", run
    assert "recover again" in run["reason"]
    assert harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "verify_saved"})["state"] == "recovering"


def test_release_of_a_run_without_outcome_ends_failed(harness: Harness, cloud: Cloud) -> None:
    # A record written before outcomes existed (or by hand): release must still finish.
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    run, _ = get_store().runs.get(harness.org, run_id)
    get_store().runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"state": RunState.releasing,
                                                                          "outcome": None}))
    harness.ok("POST", f"/api/runs/{run_id}/release")
    harness.drain()
    assert harness.get_run(run_id)["state"] == "failed"
    assert not cloud.live() and not harness.step_errors


def test_recovery_start_refused_by_the_cloud_says_what_to_do(harness: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    from shared.errors import CapacityError

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).complete_failed("boom")

    def start(self: Any, ref: Any, resources: Any) -> Any:
        raise CapacityError("no A10 capacity to start this instance now")

    monkeypatch.setattr(MemoryCompute, "start", start)
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    assert status == 409, body
    assert "no A10 capacity" in body["detail"] and "verify_saved" in body["detail"]
    assert harness.get_run(run_id)["state"] == "retained"


def test_a_provider_error_echoing_the_launch_request_does_not_leak_the_agent_token(
        harness: Harness, cloud: Cloud, monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    from shared.errors import PermanentError

    tokens: list[str] = []

    def launch(self: Any, spec: Any) -> Any:
        tokens.append(spec.bootstrap.env["TENSORANT_RUN_TOKEN"])
        raise PermanentError(f"the API refused the request: {spec.bootstrap.env}")

    monkeypatch.setattr(MemoryCompute, "launch", launch)
    run_id = harness.create_run("memory", "mem-a10")
    run = harness.launch(run_id)
    assert run["state"] == "failed" and "the API refused the request" in run["reason"]
    [token] = tokens
    assert token not in str(run)
    assert token not in caplog.text


def test_retain_finds_a_machine_the_launch_step_never_recorded(harness: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    # Launch crashes after the cloud created the machine, before recording it; the agent's
    # first heartbeat moves the run on before the redelivery, which then does nothing. A
    # failure must still retain that machine's disk, not release it as "never created".
    store = get_store()

    def crash(res: Any) -> None:
        raise RuntimeError("crash after the cloud call")

    monkeypatch.setattr(store.ledger, "record", crash)
    run_id = harness.create_run("memory", "mem-a10")
    harness.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    harness.max_dequeue = 1
    harness.drain()
    harness.max_dequeue = 5
    monkeypatch.undo()
    [m] = cloud.machines.values()
    assert harness.get_run(run_id)["resources"] == []
    a = harness.agent(run_id)
    a.heartbeat("preparing")
    a.complete_failed("CUDA out of memory")
    run = harness.get_run(run_id)
    assert run["state"] == "retained", run
    assert m.state == "stopped" and m.disk_exists
