"""Entries on a run's timeline (audit lines, warnings, transitions), shown by GET /api/runs/{id}."""

from __future__ import annotations

from typing import Any

from shared.clock import now
from shared.models import RunEvent, RunRecord, RunState
from shared.store import get_store


def event(run: RunRecord, kind: str, message: str, **data: Any) -> None:
    get_store().add_event(run.id, RunEvent(at=now(), kind=kind, message=message, state=run.state, data=data))


def transition_event(before: RunState, run: RunRecord) -> None:
    msg = f"{before.value} -> {run.state.value}" + (f": {run.reason}" if run.reason else "")
    event(run, "transition", msg)
