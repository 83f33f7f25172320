"""Time that cannot delete (issue 38.1): no clock jump, skewed instance or lowered retention limit discards or
fails a run whose output could be recovered; a discard comes a full warning interval after its warning event,
counted on one steady clock (shared/runs/retention.py, heartbeat_check.serving_since)."""

from __future__ import annotations

from typing import Any

from shared.services.timers import heartbeat_check
from shared.settings import get_settings
from shared.store import get_store
from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip

DAY = 24 * 3600


def _warnings(run: dict[str, Any]) -> list[str]:
    return [e["message"] for e in run["events"] if e["kind"] == "warning" and "will be discarded" in e["message"]]


def _retained_with_checkpoint(harness: Harness) -> str:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.4)
    agent.upload(b"the adapter of the checkpoint at step 40")  # recoverable output, in storage
    agent.complete_failed("boom")
    assert harness.get_run(run_id)["state"] == "retained"
    return run_id


def _liveness() -> dict[str, Any]:
    got = get_store().table("watch").get(*heartbeat_check.LIVENESS)
    assert got is not None
    return dict(got[0])


def _recovered(harness: Harness, run_id: str) -> None:
    run = harness.recover(run_id, upload=smoke_adapter_zip())
    assert run["state"] == "succeeded" and run["adapter_kind"] == "final", run


def test_a_forward_jump_warns_a_retained_run_and_never_discards_it(harness: Harness, cloud: Cloud) -> None:
    run_id = _retained_with_checkpoint(harness)
    harness.serve(60)
    harness.clock.advance(15 * DAY)  # the host's clock jumps 15 days ahead, past the 14-day retention limit
    harness.serve(600)
    run = harness.get_run(run_id)
    # Before: the first tick discarded it (failed, released) and recorded no warning; recover answered 409.
    assert run["state"] == "retained", run["reason"]
    [warning] = _warnings(run)  # warned once, for the many ticks since
    assert "at the earliest" in warning
    [m] = cloud.machines.values()
    assert m.disk_exists
    harness.clock.advance(-15 * DAY)  # the clock comes back
    harness.serve(600)
    assert _liveness()["serving_since"] <= harness.clock.t  # nothing of the jump is left in the future
    assert harness.get_run(run_id)["state"] == "retained"
    _recovered(harness, run_id)


def test_a_discard_waits_a_full_warning_interval_on_one_clock(harness: Harness, cloud: Cloud) -> None:
    run_id = _retained_with_checkpoint(harness)
    harness.serve(60)
    harness.clock.advance(15 * DAY)
    harness.serve(60)
    assert len(_warnings(harness.get_run(run_id))) == 1
    harness.served(2 * DAY - 300)  # steady on the jumped clock, short of the warning's interval
    assert heartbeat_check.check_all(harness.ctx)["discarded"] == 0
    harness.clock.advance(-3600)  # a backward step restarts the countdown, silently
    harness.serve(0)
    harness.served(2 * DAY - 300)
    assert heartbeat_check.check_all(harness.ctx)["discarded"] == 0
    assert len(_warnings(harness.get_run(run_id))) == 1
    harness.served(600)  # now a full interval of one clock since the countdown began
    assert heartbeat_check.check_all(harness.ctx)["discarded"] == 1
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "failed" and "warned 2 days before" in run["reason"], run["reason"]


def test_a_backward_jump_does_not_leave_silence_unjudged(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=DAY)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.2)
    harness.serve(120)
    harness.clock.advance(3600)  # an hour ahead for a few ticks, then back
    harness.serve(120)
    harness.clock.advance(-3600 - 180)
    assert harness.get_run(run_id)["state"] == "training"
    # The agent stops. Before: serving_since stayed an hour in the future, so its silence was never judged.
    harness.serve(get_settings().heartbeat_timeout_s + 300)
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and "heartbeat went silent" in run["reason"], run
    assert _liveness()["serving_since"] <= harness.clock.t


def test_a_second_instance_whose_clock_is_ahead_deletes_nothing(harness: Harness, cloud: Cloud) -> None:
    kept = _retained_with_checkpoint(harness)
    booting = harness.create_run("memory", "mem-a10", runtime_limit_s=DAY)
    harness.launch(booting)
    harness.serve(60)
    skew = 15 * DAY
    for _ in range(30):  # two instances tick in turn, one with its clock 15 days ahead
        harness.clock.advance(skew)
        harness.serve(0)
        harness.clock.advance(-skew + 30)
        harness.serve(0)
    assert harness.get_run(kept)["state"] == "retained"
    # Its boot deadline and runtime limit, which would fail it, are judged on no clock that jumps.
    assert harness.get_run(booting)["state"] == "provisioning", harness.get_run(booting)["reason"]
    assert len(_warnings(harness.get_run(kept))) == 1
    # The skewed instance goes; the other serves on, and the booting machine reports.
    harness.agent(booting).heartbeat("training", 0.1)
    harness.serve(get_settings().heartbeat_timeout_s)
    assert harness.get_run(booting)["state"] == "training"
    assert harness.get_run(kept)["state"] == "retained"
    _recovered(harness, kept)


def test_lowering_the_retention_limit_warns_first_and_lists_the_runs(harness: Harness, cloud: Cloud) -> None:
    runs = [_retained_with_checkpoint(harness) for _ in range(2)]
    harness.serve(60)
    harness.served(5 * DAY)
    answer = harness.ok("PUT", "/api/org/limits", json_body={"retention_limit_s": DAY})
    # Before: the answer was the limits alone, and the next tick discarded both runs with no warning.
    affects = {a["run_id"]: a for a in answer["retention_affects"]}
    assert set(affects) == set(runs), answer
    assert answer["retention_limit_s"] == DAY
    harness.serve(60)
    for run_id in runs:
        run = harness.get_run(run_id)
        assert run["state"] == "retained" and len(_warnings(run)) == 1, run
    harness.served(12 * 3600 - 300)  # the warning's interval under a 1-day limit is 12 h
    assert heartbeat_check.check_all(harness.ctx)["discarded"] == 0
    _recovered(harness, runs[0])
    harness.served(600)
    assert heartbeat_check.check_all(harness.ctx)["discarded"] == 1
    harness.drain()
    assert harness.get_run(runs[1])["state"] == "failed"
    # Sending the answer back as is changes nothing and lists nothing more.
    again = harness.ok("PUT", "/api/org/limits", json_body=answer)
    assert again["retention_affects"] == [] and again["retention_limit_s"] == DAY


def test_raising_the_limit_lists_nothing(harness: Harness, cloud: Cloud) -> None:
    _retained_with_checkpoint(harness)
    assert harness.ok("PUT", "/api/org/limits", json_body={"retention_limit_s": 30 * DAY})["retention_affects"] == []
