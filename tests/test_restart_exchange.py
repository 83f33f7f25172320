"""A retained machine started again after its agent's token expired (issue 33.3, issue 27's retained restart).

An agent token lives settings.agent_token_ttl_s (2 h) and is renewed by heartbeats; a retained machine is
stopped for hours or days. Started again (`recover --resume`, `recover --start`), its agent comes back with the
token it saved, now expired: every call is 401 and the resume was lost (the run waited to its heartbeat
deadline and was retained again). The restart exchange (POST /api/agent/runs/{id}/restart,
shared/services/api/boot.exchange_restart) gives it a fresh token once per start, with the claim's discipline.
The machine's side on every cloud: tests/e2e/test_resume_e2e.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import jwt
import pytest

from shared.security import AGENT_AUDIENCE, mint_agent_token
from shared.services.api.runs import actions
from shared.settings import get_settings
from shared.store import get_store
from tests.fakes import Cloud
from tests.harness import Harness, trained_adapter_zip

STOPPED_S = 3 * 3600  # longer than an agent token lives (2 h)


@pytest.fixture
def resumable(monkeypatch: Any) -> None:
    """The memory provider declared resumable, as a cloud provider's ProviderInfo does."""
    monkeypatch.setattr(actions, "resumes_training", lambda name: True)


def _retained(harness: Harness) -> tuple[str, str]:
    """A run retained with a checkpoint in storage, and its agent's token as the agent holds it: a token of the
    real lifetime, renewed by its last heartbeat before the machine was stopped."""
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    token = mint_agent_token(harness.org, run_id, ttl_s=get_settings().agent_token_ttl_s)
    beat(harness, run_id, token, "training")
    harness.agent(run_id).upload(trained_adapter_zip())  # the checkpoint's adapter, uploaded at once
    harness.ok("POST", f"/api/agent/runs/{run_id}/complete", token=token, json_body={
        "status": "failed", "reason": "stopped at the runtime limit", "exit_code": 143})
    harness.drain()
    assert harness.get_run(run_id)["state"] == "retained"
    return run_id, token


def beat(harness: Harness, run_id: str, token: str, phase: str = "training") -> tuple[int, Any]:
    status, body, _ = harness.call("POST", f"/api/agent/runs/{run_id}/heartbeat", token=token,
                             json_body={"phase": phase, "progress": 0.5, "logs": []})
    return status, body


def exchange(harness: Harness, run_id: str, token: str) -> tuple[int, Any]:
    status, body, _ = harness.call("POST", f"/api/agent/runs/{run_id}/restart", token=token)
    return status, body


def stored(harness: Harness, run_id: str) -> Any:
    return get_store().runs.get(harness.org, run_id)[0]


def test_a_resume_after_the_token_expired_was_lost_and_now_continues(harness: Harness, cloud: Cloud,
                                                                    resumable: None) -> None:
    run_id, token = _retained(harness)
    harness.clock.advance(STOPPED_S)  # the machine stays stopped past the token's lifetime
    assert harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})["state"] == "training"

    # The bug: the agent's first call after the start carries the expired token and is refused; nothing else
    # could renew it, so the run waited to its heartbeat deadline and was retained again.
    status, body = beat(harness, run_id, token)
    assert status == 401 and "expired" in body["detail"], body

    status, grant = exchange(harness, run_id, token)
    assert status == 200, grant
    status, reply = beat(harness, run_id, grant["token"])
    assert status == 200 and reply["resume"] is True and reply["state"] == "training", reply
    env = json.loads(base64.b64decode(grant["bootstrap"]))  # storage access from now, nothing else
    run = stored(harness, run_id)
    assert set(env) == {"TENSORANT_STORAGE_DIR", "TENSORANT_DATASET_KEY", "TENSORANT_ADAPTER_KEY",
                        "TENSORANT_LOGS_KEY", "TENSORANT_CHECKPOINT_KEYS"}, sorted(env)
    claims = jwt.decode(grant["token"], options={"verify_signature": False})
    assert (claims["org"], claims["run"], claims["aud"]) == (harness.org, run_id, AGENT_AUDIENCE)
    assert claims["exp"] - claims["iat"] == get_settings().agent_token_ttl_s
    assert run.restart_exchanged_at is not None and run.restart_exchanged_at >= run.restart_requested_at

    for phase in ("training", "exporting"):
        assert beat(harness, run_id, grant["token"], phase)[0] == 200
    data = trained_adapter_zip()
    harness.agent(run_id).upload(data)
    import hashlib

    harness.ok("POST", f"/api/agent/runs/{run_id}/complete", token=grant["token"], json_body={
        "status": "ok", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    harness.drain()
    run_view = harness.get_run(run_id)
    assert run_view["state"] == "succeeded", run_view["reason"]
    assert any("exchanged its expired token" in e["message"] for e in run_view["events"])


def _refused(harness: Harness, run_id: str, token: str, status: int, words: str) -> None:
    before = stored(harness, run_id)
    got, body = exchange(harness, run_id, token)
    assert got == status and words in body["detail"], (got, body)
    after = stored(harness, run_id)
    assert (after.state, after.restart_exchanged_at, after.restart_requested_at) == (
        before.state, before.restart_exchanged_at, before.restart_requested_at)


def test_the_exchange_refuses_every_token_but_the_runs_own_from_before_the_start(
        harness: Harness, cloud: Cloud, resumable: None) -> None:
    run_id, token = _retained(harness)
    other_id, other_token = _retained(harness)
    harness.clock.advance(STOPPED_S)
    # Before any start: nothing to exchange, and nothing is written for it.
    _refused(harness, run_id, token, 409, "never started this run's machine again")
    assert not any("restart" in e["message"] for e in harness.get_run(run_id)["events"])

    harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    claims = jwt.decode(token, options={"verify_signature": False})
    forged = jwt.encode(claims, "another-deployments-key-0123456789abcdef", algorithm="HS256")
    _refused(harness, run_id, forged, 401, "signature")
    _refused(harness, run_id, other_token, 403, "not the token of this run")
    fresh = mint_agent_token(harness.org, run_id, ttl_s=get_settings().agent_token_ttl_s)  # issued after the start
    _refused(harness, run_id, fresh, 409, "issued after the machine was started again")
    user = harness.owner
    _refused(harness, run_id, user, 403, "agent token")
    assert exchange(harness, other_id, other_token)[0] == 409  # the other run was not started: its own is refused too

    assert exchange(harness, run_id, token)[0] == 200
    _refused(harness, run_id, token, 409, "exchange was made at")  # a second exchange of the same start
    warnings = [e["message"] for e in harness.get_run(run_id)["events"] if e["kind"] == "warning"]
    assert any("exchange of an agent token for the restart of the machine was refused" in w for w in warnings)


def test_a_start_for_recovery_after_the_token_expired_reaches_its_verification(
        harness: Harness, cloud: Cloud, resumable: None) -> None:
    """recover --start: the agent on the started machine exchanges its token once; a later resume is a new
    start, whose exchange is open again for the token the first one gave (itself expired meanwhile)."""
    run_id, token = _retained(harness)
    harness.clock.advance(STOPPED_S)
    assert harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})["state"] == "retained"
    status, grant = exchange(harness, run_id, token)
    assert status == 200, grant
    status, reply = beat(harness, run_id, grant["token"])
    assert status == 200 and reply["stop"] is True and reply["resume"] is False, reply  # waits, with a live token

    harness.clock.advance(STOPPED_S)  # the owner takes hours to decide: the fresh token expired too
    assert beat(harness, run_id, grant["token"])[0] == 401
    assert harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})["state"] == "training"
    status, again = exchange(harness, run_id, grant["token"])
    assert status == 200, again
    assert exchange(harness, run_id, token)[0] == 409  # the first token's start was exchanged already
    assert beat(harness, run_id, again["token"])[1]["resume"] is True


def test_a_start_for_recovery_reaches_the_verification_and_the_ended_run_refuses_the_exchange(
        harness: Harness, cloud: Cloud, resumable: None) -> None:
    """recover --start hours after the retain, the agent's token exchanged, then the saved adapter verified: the
    run succeeds, and its ended run accepts no exchange (nor any agent call) any more."""
    run_id, token = _retained(harness)
    harness.clock.advance(STOPPED_S)
    harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    status, grant = exchange(harness, run_id, token)
    assert status == 200 and beat(harness, run_id, grant["token"])[0] == 200, grant
    run = harness.recover(run_id)
    assert run["state"] == "succeeded", (run["reason"], harness.step_errors)
    _refused(harness, run_id, grant["token"], 401, "no longer accepted")


def test_the_route_is_documented_for_the_agent(harness: Harness) -> None:
    spec = harness.ok("GET", "/api/openapi.json", token=None)
    op = spec["paths"]["/api/agent/runs/{id}/restart"]["post"]
    assert op["security"] == [{"agent": []}] and {"401", "403", "404", "409"} <= set(op["responses"])
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/RestartGrant")


# ---------------------------------------------------------------- the agent's side (machine/agent)

class _Plane:
    """A control plane on loopback that refuses every token but `good`, and answers the restart exchange once."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.good = "fresh-token"
        self.calls: list[tuple[str, str]] = []
        self.exchanges_left = 1
        self.down = False  # the restart route answers 503
        plane = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                what, token = self.path.rsplit("/", 1)[1], self.headers["Authorization"].split(" ", 1)[1]
                plane.calls.append((what, token))
                if what == "restart" and plane.down:
                    self._answer(503, {"detail": "the state store is unreachable"})
                elif what == "restart" and plane.exchanges_left:
                    plane.exchanges_left -= 1
                    env = {"TENSORANT_ADAPTER_UPLOAD_URL": "https://storage.example/new-adapter?sig=2",
                           "TENSORANT_RUN_ID": "r-another", "TENSORANT_API_URL": "https://elsewhere.example"}
                    self._answer(200, {"token": plane.good, "bootstrap": base64.b64encode(json.dumps(env).encode())
                                       .decode()})
                elif what == "restart":
                    self._answer(409, {"detail": "the restart exchange was refused"})
                else:
                    self._answer(200 if token == plane.good else 401, {"state": "training", "stop": False})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_the_agent_exchanges_an_expired_token_once_and_continues_with_what_it_gets(tmp_path: Any) -> None:
    from machine.agent.config import AgentConfig
    from machine.agent.heartbeat import Reporter

    plane = _Plane()
    try:
        env = {"TENSORANT_RUN_ID": "r-0123456789ab", "TENSORANT_API_URL": plane.url, "TENSORANT_RUN_TOKEN": "old-token",
               "TENSORANT_DATA_DIR": str(tmp_path), "TENSORANT_ADAPTER_UPLOAD_URL": "https://storage.example/a?sig=1",
               "TENSORANT_DATASET_URL": "https://storage.example/d?sig=1"}
        config = AgentConfig.from_env(env)
        agent = Reporter(config, environ=env)
        plane.down = True  # no answer to the exchange: offered again at the next refusal, not given up
        assert not agent.api.post("heartbeat", {"phase": "training"}, give_up_after_s=0.1).ok
        plane.down = False
        plane.calls.clear()
        answer = agent.api.post("heartbeat", {"phase": "training"}, give_up_after_s=5)
        assert answer.ok and plane.calls == [("heartbeat", "old-token"), ("restart", "old-token"),
                                             ("heartbeat", "fresh-token")], plane.calls
        # The storage access it was handed replaces the launch's; nothing else (run, API) can change.
        assert agent.config.adapter_upload_url == "https://storage.example/new-adapter?sig=2"
        assert agent.api.config is agent.config and agent.guard.config is agent.config
        assert (agent.config.run_id, agent.config.api_url) == ("r-0123456789ab", plane.url)
        assert agent.config.dataset_url == "https://storage.example/d?sig=1"

        # Restarted again on the same disk: the fresh token and storage access are kept (state file, 0600).
        again = Reporter(config, environ=env)
        assert again.api.token == "fresh-token"
        assert again.config.adapter_upload_url == "https://storage.example/new-adapter?sig=2"
        assert (tmp_path / "agent-state.json").stat().st_mode & 0o777 == 0o600

        # A token the control plane refuses again is offered to the exchange once, not at every call.
        plane.good = "a-later-token"
        plane.calls.clear()
        for _ in range(3):
            assert not agent.api.post("heartbeat", {"phase": "training"}, give_up_after_s=5).ok
        assert [what for what, _ in plane.calls] == ["heartbeat", "restart", "heartbeat", "heartbeat"], plane.calls
    finally:
        plane.server.shutdown()


def test_an_agent_started_again_on_its_disk_is_not_stopped_by_the_deadline_at_launch(tmp_path: Any) -> None:
    """Hours after the launch's deadline the control plane starts the retained machine again: the agent's guard
    (machine/agent/guard.py) must not power it off within seconds for a deadline that no longer holds. A first
    start past it still stops."""
    import time

    from machine.agent.config import AgentConfig
    from machine.agent.heartbeat import Reporter
    from machine.agent.state import STATE_FILE

    def agent_on(data_dir: Any) -> Reporter:
        env = {"TENSORANT_RUN_ID": "r-0123456789ab", "TENSORANT_API_URL": "http://127.0.0.1:9", "TENSORANT_RUN_TOKEN": "t",
               "TENSORANT_DATA_DIR": str(data_dir), "TENSORANT_DEADLINE_AT": str(int(time.time()) - 3 * 3600)}
        return Reporter(AgentConfig.from_env(env), environ=env)

    assert "deadline" in agent_on(tmp_path / "first").guard.reason(working=True)
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / STATE_FILE).write_text(json.dumps({"run_id": "r-0123456789ab", "phase": "training",
                                                              "stopped": True, "stop_reason": "retained"}))
    assert agent_on(tmp_path / "again").guard.reason(working=True) == ""
