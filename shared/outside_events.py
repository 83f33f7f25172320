"""The one list of event types told to the outside (the run's history, webhooks and the console alike).

A run's transition into one of BY_STATE's states is one of them; other events carry their type in
`data["type"]` (shared.runs.events.event(..., type=...)). Webhooks are derived from both
(shared/runs/outbox.py)."""

from __future__ import annotations

from enum import StrEnum

from shared.models import RunState


class OutsideEvent(StrEnum):
    run_queued = "run.queued"
    run_training = "run.training"  # the trainer started
    run_succeeded = "run.succeeded"
    run_failed = "run.failed"
    run_cancelled = "run.cancelled"
    run_retained = "run.retained"
    run_retention_warning = "run.retention_warning"
    run_pace_warning = "run.pace_warning"  # it will not finish in its runtime limit
    run_attempt_refused = "run.attempt_refused"  # a candidate refused for capacity (failover)
    budget_threshold = "budget.threshold"
    connection_check_failed = "connection.check_failed"


TYPES: tuple[str, ...] = tuple(e.value for e in OutsideEvent)
# Sent only by POST /api/org/webhooks/{id}/test, to that endpoint whatever it subscribes to.
TEST_EVENT = "webhook.test"

BY_STATE: dict[RunState, OutsideEvent] = {
    RunState.queued: OutsideEvent.run_queued,
    RunState.training: OutsideEvent.run_training,
    RunState.succeeded: OutsideEvent.run_succeeded,
    RunState.failed: OutsideEvent.run_failed,
    RunState.cancelled: OutsideEvent.run_cancelled,
    RunState.retained: OutsideEvent.run_retained,
}


def for_transition(before: RunState, after: RunState) -> OutsideEvent | None:
    """The outside event of a move from `before` to `after`, if it is one."""
    return BY_STATE.get(after) if after != before else None
