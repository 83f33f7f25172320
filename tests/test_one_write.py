"""The one write of a run (Runs.decide, and mutate over it) keeps the transition table whoever built the
record, and a change returns its decision: a lost race calls it again, and what the caller acts on is what
the attempt that was written decided (issue 44 item 3)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import ConcurrencyError
from shared.lifecycle import IllegalTransition, transition
from shared.models import Outcome, RunRecord, RunState
from shared.runs.moves import decide_stored
from shared.store import get_store
from shared.store.runs import Runs
from tests.fakes import Cloud
from tests.harness import Harness


def _launched(org: str, run_id: str) -> None:
    """The draft moved to queued, then provisioning, as the table allows (no cloud call)."""
    get_store().runs.mutate(org, run_id, lambda r: transition(r, RunState.queued))
    get_store().runs.mutate(org, run_id, lambda r: transition(r, RunState.provisioning))


def _stored(org: str, run_id: str) -> tuple[RunRecord, str]:
    return get_store().runs.get(org, run_id)


def test_a_state_change_the_table_forbids_is_refused_and_nothing_is_written(harness: Harness) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    before, etag = _stored(harness.org, run_id)
    assert before.state == RunState.draft
    runs = get_store().runs
    # draft -> succeeded, built by hand (no lifecycle.transition): the store refuses it.
    with pytest.raises(IllegalTransition, match="cannot go from draft to succeeded"):
        runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"state": RunState.succeeded, "reason": "forged"}))
    with pytest.raises(IllegalTransition, match="cannot go from draft to training"):
        runs.decide(harness.org, run_id, lambda r: (r.model_copy(update={"state": RunState.training}), "decided"))
    after, etag_after = _stored(harness.org, run_id)
    assert (after, etag_after) == (before, etag)  # nothing was written
    assert get_store().runs.in_org(harness.org, {RunState.succeeded, RunState.training}) == []
    # A note (the state kept) and a move the table allows are written as before.
    noted, wrote = runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"reason": "a note"}))
    assert wrote and noted.reason == "a note"
    moved, wrote = runs.mutate(harness.org, run_id, lambda r: transition(r, RunState.queued))
    assert wrote and moved.state == RunState.queued


def test_out_of_releasing_only_to_its_outcome_and_a_heartbeat_may_skip_phases(harness: Harness) -> None:
    runs = get_store().runs
    run_id = harness.create_run("memory", "mem-a10")
    _launched(harness.org, run_id)
    # provisioning -> training in one write: a walk along the agent's phases (each step is in the table).
    walked, wrote = runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"state": RunState.training}))
    assert wrote and walked.state == RunState.training
    # ...but never back.
    with pytest.raises(IllegalTransition, match="from training to preparing"):
        runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"state": RunState.preparing}))
    runs.mutate(harness.org, run_id, lambda r: transition(r, RunState.releasing, outcome=Outcome.cancelled))
    # The table has releasing -> succeeded, but a run released for a cancel ends cancelled.
    with pytest.raises(IllegalTransition, match="from releasing to succeeded"):
        runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"state": RunState.succeeded}))
    assert _stored(harness.org, run_id)[0].state == RunState.releasing
    ended, _ = runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"state": RunState.cancelled}))
    assert ended.state == RunState.cancelled


def _lose_first_race(monkeypatch: pytest.MonkeyPatch, interloper: Any) -> list[int]:
    """Make the first write of the run lose its race: just before it, another writer changes the run
    (`interloper(run) -> run`, written with the stored ETag), so the write's ETag is refused."""
    real_put = Runs.put
    calls: list[int] = []

    def put(self: Runs, rec: RunRecord, etag: str) -> str:
        calls.append(1)
        if len(calls) == 1:
            stored, stored_etag = self.get(rec.org, rec.id)
            real_put(self, interloper(stored), stored_etag)
        return real_put(self, rec, etag)

    monkeypatch.setattr(Runs, "put", put)
    return calls


def test_a_retried_update_returns_the_decision_of_the_attempt_that_was_written(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    calls = _lose_first_race(monkeypatch, lambda r: r.model_copy(update={"reason": "written in between"}))

    def change(r: RunRecord) -> tuple[RunRecord | None, str]:
        # The decision is what this attempt saw: the first saw "", the second the interloper's note.
        return r.model_copy(update={"reason": r.reason + "+mine"}), f"saw {r.reason!r}"

    run, wrote, decision = get_store().runs.decide(harness.org, run_id, change)
    assert len(calls) == 2  # the first write was refused (ETag), the second written
    assert wrote and run.reason == "written in between+mine"
    assert decision == "saw 'written in between'"
    assert _stored(harness.org, run_id)[0].reason == "written in between+mine"


def test_a_retried_move_reports_the_state_it_moved_from_in_the_written_attempt(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    _launched(harness.org, run_id)
    # A heartbeat moves the run on between this change's read and its write.
    _lose_first_race(monkeypatch, lambda r: transition(r, RunState.preparing))

    def cancel(r: RunRecord) -> tuple[RunRecord | None, RunState]:
        return transition(r, RunState.retaining, reason="cancelled"), r.state

    run, wrote, was = decide_stored(harness.ctx, harness.org, run_id, cancel)
    assert wrote and run.state == RunState.retaining
    assert was == RunState.preparing  # not the provisioning the lost attempt saw
    assert run.moved_from == RunState.preparing


def test_a_heartbeat_that_lost_its_race_numbers_its_lines_from_the_write_that_won(
        harness: Harness, cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.1, logs=["one", "two"])
    # Another heartbeat's write (3 lines) lands between this one's read and its write.
    _lose_first_race(monkeypatch, lambda r: r.model_copy(update={"log_lines": r.log_lines + 3}))
    agent.heartbeat("training", 0.2, logs=["three"])
    run, _ = _stored(harness.org, run_id)
    assert run.log_lines == 6
    lines, _ = get_store().logs.read(run_id, 0, 100)
    assert lines == ["one", "two", "three"]
    # Numbered 5: after the other heartbeat's three (whose chunk this test never wrote), not 2.
    assert get_store().logs.read(run_id, 5, 100)[0] == ["three"]


def test_a_race_lost_every_time_raises_and_writes_nothing(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    monkeypatch.setattr(Runs, "put", lambda self, rec, etag: (_ for _ in ()).throw(ConcurrencyError("lost")))
    before = _stored(harness.org, run_id)
    with pytest.raises(ConcurrencyError, match="kept changing"):
        get_store().runs.decide(harness.org, run_id, lambda r: (r.model_copy(update={"reason": "x"}), "never returned"))
    assert _stored(harness.org, run_id) == before
