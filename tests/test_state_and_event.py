"""A run's state and the transition event that records its change are visible together (issue 38.7): the run
and its events live in different tables, so the event is written just after the run (or never, when the
writer dies in between); the view adds the change from the run's own record until the event is there.
tests/e2e/test_local_e2e.py::test_trial_reaches_succeeded_over_http read `succeeded` without its
`releasing -> succeeded` event."""

from __future__ import annotations

from typing import Any

from shared.runs import moves
from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip


def _transitions(run: dict[str, Any]) -> list[str]:
    return [e["message"].split(":")[0] for e in run["events"] if e["kind"] == "transition"]


def test_a_state_is_never_shown_without_its_transition_event(harness: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.5)
    # Every writer from here on dies between the run's write and its event's (or is read in that gap).
    monkeypatch.setattr(moves, "transition_event", lambda ctx, before, run: None)
    agent.train(smoke_adapter_zip())
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded"
    walked = _transitions(run)
    assert walked[-1] == "releasing -> succeeded", walked
    [last] = [e for e in run["events"] if e["kind"] == "transition"][-1:]
    assert last["state"] == "succeeded"


def test_the_written_event_replaces_the_derived_one(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.5)
    agent.train(smoke_adapter_zip())
    harness.drain()
    run = harness.get_run(run_id)
    walked = _transitions(run)
    assert walked.count("releasing -> succeeded") == 1, walked  # once: the derived one is not added as well
    assert walked.count("queued -> provisioning") == 1, walked
