"""Never lose a machine or an adapter, and agent tokens tied to the run's life: the real handlers
on Azurite with the in-memory provider, and the real CLI against the loopback fake API of tests/test_cli.py."""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import pytest

from shared.clock import now_ts
from shared.security import mint_agent_token
from shared.store import get_store
from tests import fakes
from tests.fake_api import FakeApi, run_cli
from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip


def retained_run(harness: Harness) -> str:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).complete_failed("boom")  # an agent that does not say whether output exists
    assert harness.get_run(run_id)["state"] == "retained"
    return run_id


def the_machine(cloud: Cloud) -> fakes.Machine:
    [m] = cloud.machines.values()
    return m


# ---------------------------------------------------------------- cancel needs an explicit discard


@pytest.mark.parametrize("state", ["training", "retained"])
def test_a_bare_cancel_of_a_run_that_may_hold_output_is_refused(harness: Harness, cloud: Cloud, state: str) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    if state == "training":
        harness.agent(run_id).heartbeat("training", 0.5)
    else:
        harness.agent(run_id).complete_failed("boom")
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/cancel", json_body={})
    harness.drain()
    assert status == 422, body
    assert body["errors"][0]["field"] == "discard"
    assert "discard: true" in body["detail"] and "discard: false" in body["detail"]
    assert harness.get_run(run_id)["state"] == state
    assert the_machine(cloud).disk_exists  # the only copy of the output is still there


def test_runs_without_output_cancel_without_discard(harness: Harness, cloud: Cloud) -> None:
    draft = harness.create_run("memory", "mem-a10")
    harness.ok("POST", f"/api/runs/{draft}/cancel", json_body={})
    assert harness.get_run(draft)["state"] == "cancelled"
    provisioning = harness.create_run("memory", "mem-a10")
    harness.launch(provisioning)
    assert harness.get_run(provisioning)["state"] == "provisioning"
    harness.ok("POST", f"/api/runs/{provisioning}/cancel", json_body={})
    harness.drain()
    assert harness.get_run(provisioning)["state"] == "cancelled" and not cloud.live()


def _view(state: str) -> dict[str, Any]:
    return {"id": "r1", "state": state, "phase": "", "progress": 0.0, "reason": ""}


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_cli_cancel_asks_before_a_discard(fake_api: FakeApi, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("POST", "/api/runs/r1/cancel", _view("releasing"))
    sent = lambda: [json.loads(r["body"]) for r in fake_api.sent("POST", "/api/runs/r1/cancel")]  # noqa: E731
    # Not a terminal and no --yes: refused, nothing sent.
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert run_cli(fake_api, "runs", "cancel", "r1", "--discard") == 1
    assert "--yes" in capsys.readouterr().err and sent() == []
    # A terminal: asked; "n" sends nothing, "y" discards.
    monkeypatch.setattr("sys.stdin", _Tty("n\n"))
    assert run_cli(fake_api, "runs", "cancel", "r1", "--discard") == 1
    assert sent() == []
    monkeypatch.setattr("sys.stdin", _Tty("y\n"))
    assert run_cli(fake_api, "runs", "cancel", "r1", "--discard") == 0
    assert sent() == [{"discard": True}]
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert run_cli(fake_api, "runs", "cancel", "r1", "--discard", "--yes") == 0
    assert run_cli(fake_api, "runs", "cancel", "r1", "--keep") == 0
    # Neither: nothing is decided for the user (the API refuses where output may exist).
    assert run_cli(fake_api, "runs", "cancel", "r1") == 0
    assert sent()[1:] == [{"discard": True}, {"discard": False}, {}]


# ---------------------------------------------------------------- stopping a machine started for recovery


def test_stop_a_machine_started_for_recovery(harness: Harness, cloud: Cloud) -> None:
    run_id = retained_run(harness)
    m = the_machine(cloud)
    assert m.state == "stopped"
    run = harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    assert m.state == "running"
    assert "billing resumes" in run["billing_note"] and f"runs stop {run_id}" in run["billing_note"]
    assert get_store().runs.get(harness.org, run_id)[0].machine_started_at is not None

    status, run, _ = harness.call("POST", f"/api/runs/{run_id}/stop", token="member")
    assert status == 202, run
    assert m.state == "stopped" and m.disk_exists
    assert run["state"] == "retained" and run["billing_note"] == "compute stopped; the disk still bills"
    assert get_store().runs.get(harness.org, run_id)[0].machine_started_at is None
    # Only a retained run's machine is the user's to stop.
    other = harness.create_run("memory", "mem-a10")
    status, body, _ = harness.call("POST", f"/api/runs/{other}/stop")
    assert status == 409 and "draft" in body["detail"]


def test_an_idle_started_machine_is_stopped_with_a_warning(harness: Harness, cloud: Cloud,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from shared import settings

    monkeypatch.setenv("TENSORANT_RECOVERY_IDLE_STOP_S", "900")
    settings.reset_settings()
    run_id = retained_run(harness)
    harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    m = the_machine(cloud)
    harness.clock.advance(600)
    harness.tick("heartbeat_check")
    assert m.state == "running"  # inside the window
    harness.clock.advance(400)
    harness.tick("heartbeat_check")
    assert m.state == "running"  # the timer only sends stop-idle: it never waits on a cloud
    harness.drain()
    assert m.state == "stopped" and m.disk_exists
    run = harness.get_run(run_id)
    assert run["state"] == "retained"
    warnings = [e["message"] for e in run["events"] if e["kind"] == "warning"]
    assert any("stopped automatically after 900 s" in w for w in warnings), warnings
    assert get_store().runs.get(harness.org, run_id)[0].machine_started_at is None


def test_cli_runs_stop(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("POST", "/api/runs/r1/stop", {**_view("retained"), "billing_note": "compute stopped"})
    assert run_cli(fake_api, "runs", "stop", "r1") == 0
    assert fake_api.sent("POST", "/api/runs/r1/stop")
    assert "billing: compute stopped" in capsys.readouterr().out


# ---------------------------------------------------------------- retain only what can be recovered


def _complete(harness: Harness, run_id: str, **body: Any) -> Any:
    a = harness.agent(run_id)
    out = harness.ok("POST", f"/api/agent/runs/{run_id}/complete", token=a.token, json_body={"status": "failed", **body})
    harness.drain()
    return out


def test_a_failure_with_nothing_to_recover_is_released(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.1)
    _complete(harness, run_id, reason="the trainer exited with code 1", exit_code=1, output_exists=False,
              last_lines=["loading model", "RuntimeError: CUDA out of memory"])
    run = harness.get_run(run_id)
    assert run["state"] == "failed", run
    assert "CUDA out of memory" in run["reason"] and "no output to recover" in run["reason"]
    assert not cloud.live()  # machine and disk gone: nothing bills


def test_a_failure_after_output_is_retained(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    _complete(harness, run_id, reason="could not upload adapter.zip", exit_code=None, output_exists=True)
    assert harness.get_run(run_id)["state"] == "retained"
    assert the_machine(cloud).disk_exists


def test_exit_code_0_without_an_adapter_says_so(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    _complete(harness, run_id, reason="no adapter_config.json", exit_code=0, output_exists=False)
    reason = harness.get_run(run_id)["reason"]
    assert "training failed (exit code 0)" not in reason
    assert reason.startswith("the trainer exited with code 0 but wrote no adapter")


# ---------------------------------------------------------------- agent tokens and the adapter


def _claims(token: str) -> dict[str, Any]:
    import jwt

    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


def test_agent_tokens_are_short_lived_renewed_and_refused_once_the_run_ended(harness: Harness, cloud: Cloud) -> None:
    from shared.settings import get_settings

    s = get_settings()
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    boot = _claims(the_machine(cloud).env["TENSORANT_RUN_TOKEN"])
    assert boot["exp"] - boot["iat"] == s.provisioning_timeout_s + s.agent_token_ttl_s  # not 8 days

    young = mint_agent_token(harness.org, run_id, ttl_s=s.agent_token_ttl_s)
    path = f"/api/agent/runs/{run_id}/heartbeat"
    reply = harness.ok("POST", path, token=young, json_body={"phase": "preparing"})
    assert reply["stop"] is False and "token" not in reply  # plenty of life left: no renewal
    old = mint_agent_token(harness.org, run_id, ttl_s=60)
    reply = harness.ok("POST", path, token=old, json_body={"phase": "training"})
    fresh = reply["token"]
    claims = _claims(fresh)
    assert claims["run"] == run_id and claims["exp"] - now_ts() > s.agent_token_ttl_s - 60
    assert harness.ok("POST", path, token=fresh, json_body={"phase": "training"})["state"] == "training"

    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": True})
    harness.drain()
    assert harness.get_run(run_id)["state"] == "cancelled"
    for what, body in (("heartbeat", {"phase": "training"}), ("complete", {"status": "failed"})):
        status, problem, _ = harness.call("POST", f"/api/agent/runs/{run_id}/{what}", token=fresh, json_body=body)
        assert status == 401 and "cancelled" in problem["detail"], (what, problem)


def test_an_adapter_replaced_after_verification_is_refused(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    data = smoke_adapter_zip()
    harness.agent(run_id).train(data)
    assert harness.get_run(run_id)["state"] == "succeeded"
    status, got, _ = harness.call("GET", f"/api/runs/{run_id}/adapter")
    assert status == 200 and got == data
    # The agent's presigned upload URL outlives the run: a late PUT replaces the object.
    replaced = smoke_adapter_zip(rows=99)
    harness.agent(run_id).upload(replaced)
    status, problem, _ = harness.call("GET", f"/api/runs/{run_id}/adapter")
    assert status == 409 and hashlib.sha256(data).hexdigest()[:12] in problem["detail"], problem
    warned = [e for e in get_store().events.read(run_id, kind="warning") if "changed after it was verified" in e.message]
    assert [(e.data["expected"], e.data["actual"]) for e in warned] == [
        (hashlib.sha256(data).hexdigest(), hashlib.sha256(replaced).hexdigest())]


def test_a_failed_upload_says_so_not_training_failed(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    _complete(harness, run_id, reason="could not upload adapter.zip: HTTP 403 Forbidden", exit_code=None,
              output_exists=True, stage="upload")
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and run["reason"].startswith("the adapter upload failed: could not upload"), run
