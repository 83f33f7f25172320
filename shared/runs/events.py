"""Entries on a run's timeline (audit lines, warnings, transitions), shown by GET /api/runs/{id}."""

from __future__ import annotations

from typing import Any

from shared.clock import now
from shared.models import RunEvent, RunRecord, RunState
from shared.outside_events import TYPES
from shared.store import get_store

# Events a caller can make again at will (a machine's boot-failure reports after it had reported, a second
# bootstrap claim, draft edits; 100 in 2.3 s were written) are counted per run and `source`: past this
# many, one warning says further ones are dropped, then nothing is written.
MAX_EVENTS_PER_SOURCE = 50


def event(run: RunRecord, kind: str, message: str, *, source: str = "", **data: Any) -> None:
    """One entry on the run's timeline; `source`: what a caller repeats (see MAX_EVENTS_PER_SOURCE). With
    `type=` one of the outside event types (shared/outside_events.py), its webhooks are sent."""
    if source:
        n = get_store().events.count(run.org, run.id, source, MAX_EVENTS_PER_SOURCE)
        if n > MAX_EVENTS_PER_SOURCE + 1:
            return
        if n == MAX_EVENTS_PER_SOURCE + 1:
            kind, data = "warning", {}
            message = (f"this run reached {MAX_EVENTS_PER_SOURCE} events from {source}; further ones are "
                       "not recorded")
    get_store().events.add(run.id, RunEvent(at=now(), kind=kind, message=message, state=run.state, data=data))
    if data.get("type") in TYPES:  # an outside event: its webhooks (shared/runs/outbox.py)
        from shared.runs.outbox import notify

        notify(run, str(data["type"]), message)


def transition_event(before: RunState, run: RunRecord) -> None:
    msg = f"{before.value} -> {run.state.value}" + (f": {run.reason}" if run.reason else "")
    event(run, "transition", msg)
