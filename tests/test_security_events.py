"""A run's events are bounded per source, and the run view shows the newest with the first
(shared/runs/events.py, store.events.count, runs/view.timeline); the boot-failure report's exit code is an int."""

from __future__ import annotations

from shared.runs.events import MAX_EVENTS_PER_SOURCE, event
from shared.services.api.runs.view import VIEW_EVENTS
from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip


def _warnings(harness: Harness, run_id: str) -> list[str]:
    from shared.store import get_store

    return [e.message for e in get_store().events.read(run_id, kind="warning")]


def test_boot_failure_reports_after_the_agent_reported_are_bounded(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.2)
    for _ in range(MAX_EVENTS_PER_SOURCE + 30):  # 100 in 2.3 s were each an event
        status, body, _ = harness.call("POST", f"/api/agent/runs/{run_id}/boot-failed", token=agent.token,
                                 json_body={"stage": "pull", "exit_code": 1})
        assert status == 200 and body["state"] == "training", body
    reports = [w for w in _warnings(harness, run_id) if w.startswith("the machine reported")]
    assert len(reports) == MAX_EVENTS_PER_SOURCE, len(reports)
    assert sum("further ones are not recorded" in w for w in _warnings(harness, run_id)) == 1


def test_draft_edits_write_a_bounded_number_of_events(harness: Harness, cloud: Cloud) -> None:
    from shared.store import get_store

    run_id = harness.create_run("memory", "mem-a10")
    for i in range(MAX_EVENTS_PER_SOURCE + 5):
        harness.ok("PATCH", f"/api/runs/{run_id}", json_body={"price_limit_per_hour": 10 + i % 2})
    edits = [e for e in get_store().events.read(run_id) if e.message.startswith("draft edited")]
    assert len(edits) <= MAX_EVENTS_PER_SOURCE, len(edits)


def test_the_run_view_shows_the_newest_events_with_the_first(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.2)
    from shared.store import get_store

    run, _ = get_store().runs.get(harness.org, run_id)
    for i in range(VIEW_EVENTS + 50):  # any flood of events between the launch and the end
        harness.clock.advance(1)
        event(harness.ctx, run, "audit", f"note {i}")
    harness.clock.advance(1)
    agent.train(smoke_adapter_zip())
    view = harness.ok("GET", f"/api/runs/{run_id}")
    assert view["state"] == "succeeded"
    messages = [e["message"] for e in view["events"]]
    assert len(messages) <= VIEW_EVENTS
    # The first (events of one simulated instant come in any order) and the newest.
    assert any(m.startswith("draft saved") for m in messages[:10]) and "note 0" in messages
    assert any(m.startswith("releasing -> succeeded") for m in messages), messages[-5:]  # and the newest
    assert messages.index(f"note {VIEW_EVENTS + 49}") < len(messages) - 1  # in time order


def test_boot_failed_takes_only_an_integer_exit_code(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    for bad in (True, "1", 1.0, None):
        status, body, _ = harness.call("POST", f"/api/agent/runs/{run_id}/boot-failed", token=agent.token,
                                 json_body={"stage": "pull", "exit_code": bad})
        assert status == 422 and body["errors"][0]["field"] == "exit_code", (bad, body)
    status, body, _ = harness.call("POST", f"/api/agent/runs/{run_id}/boot-failed", token=agent.token,
                             json_body={"stage": "pull", "exit_code": 1, "attempts": "4"})
    assert status == 422 and body["errors"][0]["field"] == "attempts", body
    assert harness.get_run(run_id)["state"] == "provisioning"
