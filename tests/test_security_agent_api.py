"""The agent API's side of the machine's security items (docs/security.md, "Agent on the machine"):
a refused token is noted on a run only when its signature verifies and only on the run it names,
and a repeated completion does not queue another verification of the same adapter."""

from __future__ import annotations

import base64
import hashlib
import json

import jwt

from shared.queues import get_queues
from shared.security import AGENT_AUDIENCE, mint_agent_token
from shared.settings import get_settings
from shared.steps import Step
from shared.store import get_store
from tests.harness import Harness, smoke_adapter_zip


def active_run(harness: Harness) -> str:
    run_id: str = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.3)
    return run_id


def refused_note(harness: Harness, run_id: str) -> str:
    run, _ = get_store().runs.get(harness.org, run_id)
    return run.agent_refused


def unsigned(org: str, run_id: str) -> str:
    """A token anyone can write: alg none, or a signature made with a key of one's own."""
    claims = {"sub": f"agent:{run_id}", "org": org, "run": run_id, "typ": "agent", "iat": 1, "exp": 2,
              "aud": AGENT_AUDIENCE, "iss": f"tensorant:{get_settings().deployment_id}"}
    head = base64.urlsafe_b64encode(json.dumps({"alg": "none", "typ": "JWT"}).encode()).rstrip(b"=").decode()
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{head}.{body}."


def heartbeat_status(harness: Harness, run_id: str, token: str) -> int:
    status, _, _ = harness.call("POST", f"/api/agent/runs/{run_id}/heartbeat", token=token,
                          json_body={"phase": "training", "progress": 0.5})
    return status


def test_an_unsigned_token_writes_nothing_on_the_run_it_names(harness: Harness) -> None:
    run_id = active_run(harness)  # another org's run, as far as the caller is concerned
    forged = [unsigned(harness.org, run_id),
              jwt.encode({"org": harness.org, "run": run_id, "typ": "agent", "aud": AGENT_AUDIENCE, "iat": 1, "exp": 2},
                         "a-key-of-the-callers-own-" + "x" * 20, algorithm="HS256")]
    for token in forged:
        assert heartbeat_status(harness, run_id, token) == 401
    assert refused_note(harness, run_id) == ""


def test_a_signed_token_is_noted_only_on_the_run_it_names(harness: Harness) -> None:
    run_a, run_b = active_run(harness), active_run(harness)
    expired = mint_agent_token(harness.org, run_a, ttl_s=60)
    harness.clock.advance(61)
    assert heartbeat_status(harness, run_b, expired) in (401, 403)  # run A's token on run B's URL
    assert refused_note(harness, run_a) == "" and refused_note(harness, run_b) == ""
    assert heartbeat_status(harness, run_a, expired) == 401
    assert "expired" in refused_note(harness, run_a) and refused_note(harness, run_b) == ""


def test_a_repeated_completion_queues_one_verification(harness: Harness) -> None:
    run_id = active_run(harness)
    agent = harness.agent(run_id)
    data = smoke_adapter_zip()
    agent.upload(data)
    body = {"status": "ok", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    for _ in range(3):  # the agent retrying a completion whose answer it lost
        assert harness.ok("POST", f"/api/agent/runs/{run_id}/complete", token=agent.token, json_body=body) == {
            "state": "verifying"}
    queued = get_queues().client(Step.verify_adapter.value).peek_messages(max_messages=32)
    assert len(queued) == 1
    harness.drain()
    assert harness.get_run(run_id)["state"] == "succeeded"
