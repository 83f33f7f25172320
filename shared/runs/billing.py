"""A run's billed time kept on its record: closed machine and disk-only seconds, and the open segment
(since when, machine running or only its disk kept). Updated in the write that changes whether the
machine runs, so reading a run's cost needs no event (services/api/usage.timing reads it; records
from before it fall back to the timeline's events).

Where the machine's billing changes: the move to retained (stopped, disk kept) and a resume's move from
retained to training (started: shared/runs/moves.move_stored), a recovery start (services/api/runs/actions),
a confirmed stop (shared/runs/machine.stop_machine). The first segment opens at machine_up_at (the
launch step's create call) and the last one closes at released_at or the run's end: both already on
the record, so launch and release need no write here.
"""

from __future__ import annotations

from datetime import datetime

from shared.models import RunRecord, RunState


def switched(run: RunRecord, running: bool, at: datetime) -> RunRecord:
    """The run with its open segment closed at `at` and a new one opened, machine running or not.
    Unchanged when the record keeps no billing, the machine is not up yet or is released, or it is
    already so (a repeated stop or start)."""
    b = run.billing
    if b is None or run.machine_up_at is None or run.released_at is not None or b.machine_running == running:
        return run
    span = max(0.0, (at - (b.since or run.machine_up_at)).total_seconds())
    closed = {"machine_s": b.machine_s + span} if b.machine_running else {"disk_only_s": b.disk_only_s + span}
    return run.model_copy(update={"billing": b.model_copy(update={**closed, "since": at, "machine_running": running})})


def after_move(before: RunRecord, moved: RunRecord) -> RunRecord:
    """A state change's effect on billing: retained stops the machine; a resume (retained -> training)
    starts it."""
    if moved.state == before.state:
        return moved
    if moved.state == RunState.retained:
        return switched(moved, False, moved.state_changed_at)
    if before.state == RunState.retained and moved.state == RunState.training:
        return switched(moved, True, moved.state_changed_at)
    return moved
