"""Guarded moves of a run between states, for the steps: each write is ETag-guarded, made only
from the states the caller expects, and recorded as a transition event on the run."""

from __future__ import annotations

from shared.log import redact_text
from shared.models import Outcome, RunRecord, RunState, StepMessage
from shared.queues import get_queues
from shared.runs.lifecycle import transition
from shared.runs.steps import Step
from shared.services.run_events import transition_event
from shared.store import get_store


def move(run: RunRecord, target: RunState, *, expect: set[RunState] | frozenset[RunState], reason: str | None = None,
         outcome: Outcome | None = None, **updates: object) -> tuple[RunRecord, bool]:
    """Guarded transition: only from one of `expect`; returns (run now, whether this call moved it)."""

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in expect:
            return None
        moved = transition(r, target, reason=reason, outcome=outcome)
        return moved.model_copy(update=updates) if updates else moved

    new, wrote = get_store().mutate_run(run.org, run.id, change)
    if wrote:
        transition_event(run.state, new)
    return new, wrote


def fail_to_release(run: RunRecord, reason: str) -> None:
    """Nothing worth keeping: release the run's machine (if any), then end it failed."""
    # Redacted: a provider's error text may echo the request (the bootstrap's token and keys).
    run, _ = move(run, RunState.releasing, expect={run.state}, reason=redact_text(reason), outcome=Outcome.failed)
    get_queues().send(Step.release, StepMessage(org=run.org, run_id=run.id))
