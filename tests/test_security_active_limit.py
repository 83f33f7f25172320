"""max_active_runs is one atomic decision, not a count read before the launch is written.

Before: 6 concurrent launches with max_active_runs=1 were all answered 202 and queued (more GPUs
rented than the quota allows). Now each launch takes a reservation keyed by its run id in one
ETag-guarded row of the quotas table (store.slots.reserve); it is freed when the run ends
or when the launch that took it fails, and a reservation left by a crash is dropped when counting.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from shared.models import RunState
from shared.store import get_store
from shared.store.slots import LAUNCH_GRACE_S
from tests.harness import Harness

LIMIT = 3


@pytest.fixture(autouse=True)
def active_runs_limit(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """LIMIT active runs at most; a rate limit that the bursts here never reach (the operator's ceiling raised)."""
    from shared.settings import reset_settings

    monkeypatch.setenv("TENSORANT_ORG_RUNS_PER_MINUTE_CEILING", "1000")
    reset_settings()
    harness.ok("PUT", "/api/org/limits", json_body={"max_active_runs": LIMIT, "runs_per_minute": 1000})


def launch(harness: Harness, run_id: str) -> tuple[int, Any, dict[str, str]]:
    return harness.call("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})


def active(harness: Harness) -> set[str]:
    return {r.id for r in get_store().runs.in_org(harness.org) if r.state != RunState.draft and r.state != RunState.cancelled}


def test_ten_concurrent_launches_get_exactly_the_limit(harness: Harness) -> None:
    project = harness.project_and_dataset()
    drafts = [harness.create_run("memory", "mem-a10", project=project) for _ in range(11)]
    start = threading.Barrier(10)
    answers: dict[str, tuple[int, Any, dict[str, str]]] = {}

    def go(run_id: str) -> None:
        start.wait()
        answers[run_id] = launch(harness, run_id)

    threads = [threading.Thread(target=go, args=(r,)) for r in drafts[:10]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = {r for r, (status, _, _) in answers.items() if status == 202}
    refused = {r: a for r, a in answers.items() if a[0] != 202}
    assert len(won) == LIMIT, {r: a[0] for r, a in answers.items()}
    for status, body, headers in refused.values():
        assert status == 409 and headers["Content-Type"].startswith("application/problem+json"), body
        assert f"(limit {LIMIT})" in body["detail"] and "nothing was launched" in body["detail"], body
    assert active(harness) == won  # nothing else was queued
    assert set(get_store().slots.held(harness.org)) == won
    assert all(harness.get_run(r)["state"] == "draft" for r in refused)

    harness.drain()  # the machines are made for the winners only
    status, body, _ = launch(harness, drafts[10])
    assert status == 409 and f"{LIMIT} launched runs that are not finished" in body["detail"], body
    # One run ends: its slot is free, and exactly one more launch gets it.
    ended = sorted(won)[0]
    harness.ok("POST", f"/api/runs/{ended}/cancel", token="member", json_body={"discard": True})
    harness.drain()
    assert harness.get_run(ended)["state"] == "cancelled"
    assert set(get_store().slots.held(harness.org)) == won - {ended}
    assert launch(harness, drafts[10])[0] == 202
    assert launch(harness, sorted(refused)[0])[0] == 409


def test_a_launch_refused_after_taking_its_slot_frees_it(harness: Harness) -> None:
    harness.ok("PUT", "/api/org/limits", json_body={"max_active_runs": 1})
    project = harness.project_and_dataset()
    too_dear = harness.create_run("memory", "mem-a10", project=project, price_limit=0.5)  # the offer costs 1.01/h
    status, body, _ = launch(harness, too_dear)
    assert status == 409 and "above the run's limit" in body["detail"], body
    assert get_store().slots.held(harness.org) == {}
    assert launch(harness, harness.create_run("memory", "mem-a10", project=project))[0] == 202


def test_reservations_are_idempotent_and_crash_leftovers_are_dropped(harness: Harness) -> None:
    store = get_store()
    project = harness.project_and_dataset()
    a, b, c = (harness.create_run("memory", "mem-a10", project=project) for _ in range(3))
    # A message delivered twice, or a launch retried: one run holds one slot, however often it asks.
    for _ in range(3):
        slot = store.slots.reserve(harness.org, a, 2)
        assert slot.granted and slot.active == 1
    assert list(store.slots.held(harness.org)) == [a]
    # Released twice: the second changes nothing (and never frees another run's slot).
    assert store.slots.reserve(harness.org, b, 2).granted
    store.slots.release(harness.org, a)
    store.slots.release(harness.org, a)
    assert list(store.slots.held(harness.org)) == [b]
    # A launch that died between its reservation and the run's write: its draft holds the slot
    # while the launch may still be under way, then it is dropped.
    assert not store.slots.reserve(harness.org, c, 1).granted
    harness.clock.advance(LAUNCH_GRACE_S + 1)
    assert store.slots.reserve(harness.org, c, 1).granted
    assert list(store.slots.held(harness.org)) == [c]


def test_the_reservation_of_a_run_that_ended_without_freeing_it_is_ignored(harness: Harness) -> None:
    """A crash right after the run's terminal write leaves its reservation: it counts for nothing."""
    harness.ok("PUT", "/api/org/limits", json_body={"max_active_runs": 1})
    project = harness.project_and_dataset()
    first, second = (harness.create_run("memory", "mem-a10", project=project) for _ in range(2))
    assert launch(harness, first)[0] == 202
    store = get_store()
    run, etag = store.runs.get(harness.org, first)
    store.runs.put(run.model_copy(update={"state": RunState.failed}), etag)  # ended; the release line never ran
    assert list(store.slots.held(harness.org)) == [first]
    assert launch(harness, second)[0] == 202
    assert list(store.slots.held(harness.org)) == [second]


def test_runs_launched_before_reservations_existed_still_count(harness: Harness) -> None:
    harness.ok("PUT", "/api/org/limits", json_body={"max_active_runs": 1})
    project = harness.project_and_dataset()
    first, second = (harness.create_run("memory", "mem-a10", project=project) for _ in range(2))
    assert launch(harness, first)[0] == 202
    get_store().slots.release(harness.org, first)  # as if launched by an older version: no reservation
    status, body, _ = launch(harness, second)
    assert status == 409 and "(limit 1)" in body["detail"], body
