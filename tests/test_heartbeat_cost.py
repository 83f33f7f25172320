"""What a heartbeat costs in table calls, and heartbeats racing on one run
(every agent sends one every few seconds: the hot path).

The store is the real one on Azurite; its tables are wrapped to count the calls each
request makes (the calls still go through).
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from shared.models import RunEvent, RunState
from shared.services.api.runs import view as run_service
from shared.store import get_store
from tests.fakes import Cloud, training_run
from tests.harness import Harness
from tests.table_calls import Calls


def test_a_heartbeat_is_one_write_plus_one_per_log_chunk(harness: Harness, cloud: Cloud, calls: Calls) -> None:
    run_id, agent = training_run(harness)
    calls.take()
    agent.heartbeat("training", 0.2)
    counts = calls.take()
    assert calls.writes(counts) == 1 and counts[("runs", "update")] == 1, counts
    assert calls.reads(counts) == 0, counts  # this process wrote the run last: its copy is current

    agent.heartbeat("training", 0.3, ["step 1", "step 2", "step 3"])
    counts = calls.take()
    assert calls.writes(counts) == 2, counts
    assert counts[("logs", "upsert")] == 1 and counts[("events", "upsert")] == 0, counts

    # 150 lines of 1500 characters (225 KB): more than one property can hold, so several chunks,
    # each one write; before, one event with every line failed with a 500 after the run was written.
    big = [f"{i:04d} " + "x" * 1495 for i in range(150)]
    agent.heartbeat("training", 0.4, big)
    counts = calls.take()
    chunks = counts[("logs", "upsert")]
    assert chunks >= 7 and calls.writes(counts) == 1 + chunks, counts
    page = harness.ok("GET", f"/api/runs/{run_id}/logs", params={"limit": "5000"})
    assert page["lines"] == ["step 1", "step 2", "step 3", *big]


def test_a_heartbeat_after_another_write_reads_the_run_again(harness: Harness, cloud: Cloud, calls: Calls) -> None:
    run_id, agent = training_run(harness)
    # Another instance changed the run (here: a write through a second store, with its own copies).
    from shared.settings import get_settings
    from shared.store.repo import Store

    other = Store(get_settings().storage_connection, get_settings().table_prefix)
    other.runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"progress": 0.15}))
    calls.take()
    reply = agent.heartbeat("training", 0.2)
    counts = calls.take()
    # The stale copy's write is refused by its ETag, then one read and one write.
    assert counts[("runs", "update")] == 2 and counts[("runs", "get")] == 1, counts
    assert reply["stop"] is False and get_store().runs.get(harness.org, run_id)[0].progress == 0.2

    # A run stopped elsewhere: the copy says "training", the stored run says stop; the reply follows the store.
    other.runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"state": RunState.retaining}))
    assert agent.heartbeat("training", 0.3)["stop"] is True


def test_a_phase_change_adds_only_its_transition_event(harness: Harness, cloud: Cloud, calls: Calls) -> None:
    _, agent = training_run(harness)
    calls.take()
    agent.heartbeat("exporting", 1.0)
    counts = calls.take()
    # The transition event and its newest-first copy (the run view shows the first and the newest events).
    assert counts[("runs", "update")] == 1 and counts[("events", "upsert")] == 2, counts
    assert calls.writes(counts) == 3, counts


def test_a_run_view_reads_a_bounded_page_of_events(harness: Harness, cloud: Cloud, calls: Calls) -> None:
    run_id, agent = training_run(harness)
    store = get_store()
    run, _ = store.runs.get(harness.org, run_id)
    for i in range(run_service.VIEW_EVENTS + 50):
        harness.clock.advance(0.001)  # events are keyed by the time they are written
        store.events.add(run_id, RunEvent(at=run.updated_at + timedelta(milliseconds=i), kind="warning",
                                         message=f"w{i}"))
    calls.take()
    view = harness.ok("GET", f"/api/runs/{run_id}")
    # The first half and the newest half: bounded reads of one page each.
    assert len(view["events"]) == run_service.VIEW_EVENTS
    assert view["events"][-1]["message"] == f"w{run_service.VIEW_EVENTS + 49}"
    queries = [kw for table, method, kw in calls.kwargs if table == "events" and method == "query"]
    assert queries and all(kw.get("top") == run_service.VIEW_EVENTS // 2 for kw in queries), queries


def test_concurrent_heartbeats_on_one_run_never_answer_5xx(harness: Harness, cloud: Cloud) -> None:
    run_id, _ = training_run(harness)
    token = harness.agent(run_id).token

    def beat(i: int) -> tuple[int, int]:
        status, _, _ = harness.call("POST", f"/api/agent/runs/{run_id}/heartbeat", token=token,
                              json_body={"phase": "training", "progress": 0.5, "logs": [f"line {i}"]})
        return i, status

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(beat, range(160)))
    statuses = Counter(status for _, status in answers)
    assert set(statuses) <= {200, 409}, statuses
    # Every accepted heartbeat's line is stored once, numbered without collisions; a 409 stored nothing.
    accepted = sorted(f"line {i}" for i, status in answers if status == 200)
    page = harness.ok("GET", f"/api/runs/{run_id}/logs", params={"limit": "5000"})
    assert sorted(page["lines"]) == accepted
    assert get_store().runs.get(harness.org, run_id)[0].log_lines == len(accepted)
    assert statuses[200] >= 80, statuses  # a lost race is retried, not simply refused


def test_a_race_lost_past_the_retries_answers_409_not_500(harness: Harness, cloud: Cloud,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.errors import ConcurrencyError
    from shared.store.runs import Runs

    run_id, _ = training_run(harness)

    def always_lost(self: Runs, *a: Any, **kw: Any) -> Any:
        raise ConcurrencyError("run kept changing")

    monkeypatch.setattr(Runs, "decide", always_lost)  # the one write (mutate is decide)
    status, body, headers = harness.call("POST", f"/api/runs/{run_id}/cancel", token="member", json_body={})
    assert status == 409 and body["title"] == "Conflict" and "send it again" in body["detail"], body
    assert headers.get("Retry-After") == "1"
