"""Rotating TENSORANT_JWT_SECRET under running runs: with the previous secret kept
for verification the runs succeed (agents are handed tokens on the new key at their next
heartbeat); without it, the run that goes silent says why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.settings import get_settings, reset_settings
from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip

NEW_SECRET = "rotated-secret-" + "k" * 40


@pytest.fixture
def rotate(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    def to_new_key(*, keep_previous: bool) -> None:
        old = get_settings().jwt_secret
        monkeypatch.setenv("TENSORANT_JWT_SECRET", NEW_SECRET)
        if keep_previous:
            monkeypatch.setenv("TENSORANT_JWT_SECRET_PREVIOUS", old)
        reset_settings()

    yield to_new_key
    reset_settings()


def test_runs_in_flight_survive_a_rotation_with_the_previous_key_kept(harness: Harness, cloud: Cloud, rotate) -> None:
    runs = [harness.create_run("memory", "mem-a10") for _ in range(2)]
    agents = []
    for run_id in runs:
        harness.launch(run_id)
        agent = harness.agent(run_id)  # tokens on the old key
        agent.heartbeat("training", 0.3)
        agents.append(agent)
    rotate(keep_previous=True)
    for agent in agents:
        reply = agent.heartbeat("training", 0.6)
        assert reply["stop"] is False and reply["token"], reply  # a token on the new key, at once
        agent.token = reply["token"]
    assert get_settings().jwt_secret == NEW_SECRET
    assert harness.ok("GET", f"/api/runs/{runs[0]}", token="member")["state"] == "training"  # users' old tokens too
    for agent in agents:
        agent.train(smoke_adapter_zip())
    assert [harness.get_run(r)["state"] for r in runs] == ["succeeded", "succeeded"]


def test_without_the_previous_key_the_silent_run_is_retained(harness: Harness, cloud: Cloud, rotate) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=24 * 3600)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.3)
    rotate(keep_previous=False)
    status, body, _ = harness.call("POST", f"/api/agent/runs/{run_id}/heartbeat", token=agent.token,
                             json_body={"phase": "training", "progress": 0.5})
    assert status == 401 and "rotated out" in body["detail"], body
    from shared.models import Role
    from shared.security import mint_user_token

    harness.owner = mint_user_token("owner@a", harness.org, Role.owner)  # the users logged in again
    harness.serve(get_settings().heartbeat_timeout_s + 1)
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "retained", run
    # A token signed with a key the control plane no longer has cannot be told from a forged one, so
    # its refusal is not written on the run (tests/test_security_agent_api.py): the run only says it went silent.
    assert "heartbeat went silent" in run["reason"] and "its calls were refused" not in run["reason"], run["reason"]
