"""The one way a run's state changes: an ETag-guarded write whose change moves the run only through
shared.lifecycle (transition, walk), recorded as a transition event on the run's timeline.

`move` is the common form (from the states the caller expects to one target); `move_stored` takes a
change that decides from the run as stored (a cancel's target depends on where the run is now; a
heartbeat walks phases and writes progress in the same write), and `decide_stored` one that also
returns what it decided for the caller to act on (the heartbeat's log lines, the state a cancel left).
Writes that leave the state as it is (notes, release attempts, re-send marks) use the store's
runs.mutate directly; the store refuses any write whose state change the table does not allow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from shared.context import Context
from shared.lifecycle import transition
from shared.log import redact_text
from shared.models import Outcome, RunRecord, RunState, StepMessage
from shared.outside_events import for_transition
from shared.runs import billing
from shared.runs.events import transition_event
from shared.runs.outbox import drain, with_notice
from shared.steps import Step

D = TypeVar("D")  # what a change decided, for its caller


def move_stored(ctx: Context, org: str, run_id: str, change: Callable[[RunRecord], RunRecord | None], *,
                attempts: int | None = None, from_last_write: bool = False) -> tuple[RunRecord, bool]:
    """decide_stored for a change with nothing to tell its caller. Returns (run as stored now, whether
    this call wrote it)."""
    run, wrote, _ = decide_stored(ctx, org, run_id, lambda r: (change(r), None), attempts=attempts,
                                  from_last_write=from_last_write)
    return run, wrote


def decide_stored(ctx: Context, org: str, run_id: str, change: Callable[[RunRecord], tuple[RunRecord | None, D]], *,
                  attempts: int | None = None, from_last_write: bool = False) -> tuple[RunRecord, bool, D]:
    """store.runs.decide(change), with a transition event when the write changed the run's state.

    The event's "from" state is the one `change` saw in the attempt that wrote (a lost race re-reads,
    and the run may have moved meanwhile). Returns (run as stored now, whether this call wrote it,
    the decision of the attempt that decided)."""

    def watched(r: RunRecord) -> tuple[RunRecord | None, tuple[RunState, D]]:
        new, decision = change(r)
        if new is None:
            return None, (r.state, decision)
        if new.state != r.state:  # the view shows the change with this write (events.pending_transition)
            new = new.model_copy(update={"moved_from": r.state})
        # The machine stopped (retained) or started (resumed) in this same write: its billed time.
        new = billing.after_move(r, new)
        told = for_transition(r.state, new.state)
        # The webhook notice is written with the change (the run's outbox: shared/runs/outbox.py).
        return (new if told is None else with_notice(new, told.value, new.reason)), (r.state, decision)

    kw: dict[str, Any] = {"from_last_write": from_last_write}
    if attempts is not None:
        kw["attempts"] = attempts
    new, wrote, (seen, decision) = ctx.store.runs.decide(org, run_id, watched, **kw)
    if wrote and new.state != seen:
        transition_event(ctx, seen, new)
    if wrote and new.notices:
        new = drain(ctx, new)
    return new, wrote, decision


def move(ctx: Context, run: RunRecord, target: RunState, *, expect: set[RunState] | frozenset[RunState],
         reason: str | None = None, outcome: Outcome | None = None, **updates: object) -> tuple[RunRecord, bool]:
    """Move the run to `target` only from one of `expect`, writing `updates` with it; returns (run now,
    whether this call moved it)."""

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in expect:
            return None
        moved = transition(r, target, reason=reason, outcome=outcome)
        return moved.model_copy(update=updates) if updates else moved

    return move_stored(ctx, run.org, run.id, change)


def fail_to_release(ctx: Context, run: RunRecord, reason: str) -> None:
    """Nothing worth keeping: release the run's machine (if any), then end it failed."""
    # Redacted: a provider's error text may echo the request (the bootstrap's token and keys).
    run, _ = move(ctx, run, RunState.releasing, expect={run.state}, reason=redact_text(reason), outcome=Outcome.failed)
    ctx.queues.send(Step.release, StepMessage(org=run.org, run_id=run.id))
