"""heartbeat-check: every deadline retains with its reason; lost messages are re-sent once per interval."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.queues import Queue, get_queues
from shared.settings import get_settings
from tests.chaos.provider import ChaosCloud, ChaosCompute
from tests.fakes import Cloud, serve_memory
from tests.harness import Harness


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """`cloud`, and so `harness`, on the chaos provider: its faults on demand (tests/chaos/provider.py)."""
    yield from serve_memory(ChaosCloud(), ChaosCompute)


def tick(harness: Harness) -> None:
    harness.tick("heartbeat_check")
    harness.drain()


def test_silent_heartbeat_retains_and_keeps_the_disk(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=24 * 3600)
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.2)
    harness.serve(get_settings().heartbeat_timeout_s - 5)
    assert harness.get_run(run_id)["state"] == "training"
    harness.serve(10)
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and "heartbeat went silent" in run["reason"]
    [m] = cloud.machines.values()
    assert m.state == "stopped" and m.disk_exists


def test_a_silent_run_whose_agent_token_expired_says_so_not_a_key_change(harness: Harness, cloud: ChaosCloud) -> None:
    from shared.security import mint_agent_token

    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=24 * 3600)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.2)
    agent.token = mint_agent_token(harness.org, run_id, ttl_s=300)  # one the agent failed to renew
    harness.serve(301)
    status, body, _ = harness.call("POST", f"/api/agent/runs/{run_id}/heartbeat", token=agent.token,
                             json_body={"phase": "training", "progress": 0.3})
    assert status == 401 and "expired" in body["detail"], body
    harness.serve(get_settings().heartbeat_timeout_s)
    run = harness.get_run(run_id)
    assert run["state"] == "retained", run
    assert "its calls were refused: the bearer token has expired" in run["reason"], run["reason"]
    assert "TENSORANT_AGENT_TOKEN_TTL_S" in run["reason"] and "JWT_SECRET" not in run["reason"], run["reason"]


def test_boot_deadline_releases_a_machine_that_never_reported(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=24 * 3600)
    harness.launch(run_id)  # the agent never reports (image pull hangs)
    harness.serve(get_settings().provisioning_timeout_s - 1)
    assert harness.get_run(run_id)["state"] == "provisioning"
    harness.serve(2)
    run = harness.get_run(run_id)
    # Nothing ran, so nothing can be recovered: released and failed, not retained (stopped, disk billing).
    assert run["state"] == "failed" and "boot deadline" in run["reason"] and "released" in run["reason"], run
    assert [m.state for m in cloud.machines.values()] == ["terminated"]
    assert not cloud.live()


def test_runtime_limit_retains_even_with_heartbeats(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=1200)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    for _ in range(5):
        agent.heartbeat("training", 0.5)
        harness.clock.advance(300)
        tick(harness)
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and "runtime limit of 1200 s" in run["reason"]


def test_vanished_machine_fails_with_nothing_to_release(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=24 * 3600)
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("preparing")
    cloud.machines.clear()  # deleted outside the control plane
    harness.serve(get_settings().heartbeat_timeout_s + 1)
    run = harness.get_run(run_id)
    assert run["state"] == "failed"
    assert "gone" in run["reason"] and "nothing to retain or release" in run["reason"]
    assert "heartbeat went silent" in run["reason"]


def test_lost_launch_message_is_resent_once_per_interval(harness: Harness, cloud: ChaosCloud) -> None:
    from shared.services.timers.heartbeat_check import RESEND_AFTER_S

    run_id = harness.create_run("memory", "mem-a10")
    harness.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    get_queues().client(Queue.launch.value).clear_messages()  # the message was lost
    harness.tick("heartbeat_check")
    assert get_queues().length(Queue.launch.value) == 0  # not yet: it may still be on its way
    harness.clock.advance(RESEND_AFTER_S + 1)
    harness.tick("heartbeat_check")
    harness.tick("heartbeat_check")  # a second tick right away does not send again
    assert get_queues().length(Queue.launch.value) == 1
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "provisioning" and len(cloud.machines) == 1


def test_queued_past_the_provisioning_deadline_fails_with_nothing_billed(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    get_queues().client(Queue.launch.value).clear_messages()
    harness.served(get_settings().provisioning_timeout_s + 1)  # no tick re-sends the launch meanwhile
    tick(harness)
    run = harness.get_run(run_id)
    assert run["state"] == "failed" and "nothing bills" in run["reason"]
    assert not cloud.machines


def test_second_launch_waits_for_the_first_machine_to_be_listed(harness: Harness, cloud: ChaosCloud) -> None:
    """A create that timed out after the cloud made the machine, invisible to listing for a
    while: the retry must not create a second machine."""
    from shared.services.steps.launch import launch_settle_s

    cloud.invisible_s = launch_settle_s() / 2
    fired: list[str] = []

    def pick(method: str, run_id: str) -> str | None:
        if method == "launch" and not fired:
            fired.append(run_id)
            return "timeout"  # the cloud made the machine; the call timed out anyway
        return None

    cloud.pick = pick
    run_id = harness.create_run("memory", "mem-a10")
    harness.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    for _ in range(int(launch_settle_s() // 10) + 2):  # past the claim's settle time
        harness.deliver_round(16)
        harness.clock.advance(10)
    run = harness.get_run(run_id)
    assert run["state"] == "provisioning" and len(run["resources"]) == 2
    assert cloud.created[run_id] == 1 and len(cloud.machines) == 1


def test_a_pace_that_cannot_finish_in_time_is_said_early_once(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=1200)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.0)
    harness.clock.advance(60)  # loading the model: not the pace
    agent.heartbeat("training", 0.01)  # the first step: the pace's clock starts
    harness.clock.advance(240)
    agent.heartbeat("training", 0.11)  # 10 % in 4 min: about 36 min more, the limit ends in 15
    harness.clock.advance(30)
    agent.heartbeat("training", 0.12)
    run = harness.get_run(run_id)
    warnings = [e["message"] for e in run["events"] if e["kind"] == "warning"]
    assert len(warnings) == 1 and "needs about 36 min more" in warnings[0] and "--runtime-limit" in warnings[0], \
        warnings
    assert any("[tensorant] warning: at the trainer's pace" in line
               for line in harness.ok("GET", f"/api/runs/{run_id}/logs")["lines"])


def test_a_pace_that_finishes_in_time_says_nothing(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=1200)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.0)
    harness.clock.advance(60)
    agent.heartbeat("training", 0.5)
    assert not [e for e in harness.get_run(run_id)["events"] if e["kind"] == "warning"]


def test_the_control_planes_own_outage_is_not_read_as_agent_silence(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=24 * 3600)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.2)
    harness.serve(60)
    # The control plane (or its state store) is down for 20 minutes: no tick, no heartbeat got in.
    harness.clock.advance(1200)
    harness.serve(get_settings().heartbeat_timeout_s - 60)  # serving again, for less than a heartbeat interval
    assert harness.get_run(run_id)["state"] == "training"  # the agent's silence was the control plane's
    agent.heartbeat("training", 0.4)  # the agent gets through
    harness.serve(120)
    assert harness.get_run(run_id)["state"] == "training"
    # A real silence, with the control plane serving all along, is still judged at its deadline.
    harness.serve(get_settings().heartbeat_timeout_s)
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and "heartbeat went silent" in run["reason"]
