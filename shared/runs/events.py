"""Entries on a run's timeline (audit lines, warnings, transitions), shown by GET /api/runs/{id}."""

from __future__ import annotations

from typing import Any

from shared.clock import now
from shared.context import Context
from shared.models import RunEvent, RunRecord, RunState
from shared.outside_events import TYPES
from shared.runs.outbox import notify

# Events a caller can make again at will (a machine's boot-failure reports after it had reported, a second
# bootstrap claim, draft edits; 100 in 2.3 s were written) are counted per run and `source`: past this
# many, one warning says further ones are dropped, then nothing is written.
MAX_EVENTS_PER_SOURCE = 50


def event(ctx: Context, run: RunRecord, kind: str, message: str, *, source: str = "", **data: Any) -> None:
    """One entry on the run's timeline; `source`: what a caller repeats (see MAX_EVENTS_PER_SOURCE). With
    `type=` one of the outside event types (shared/outside_events.py), its webhooks are sent."""
    if source:
        n = ctx.store.events.count(run.org, run.id, source, MAX_EVENTS_PER_SOURCE)
        if n > MAX_EVENTS_PER_SOURCE + 1:
            return
        if n == MAX_EVENTS_PER_SOURCE + 1:
            kind, data = "warning", {}
            message = (f"this run reached {MAX_EVENTS_PER_SOURCE} events from {source}; further ones are "
                       "not recorded")
    ctx.store.events.add(run.id, RunEvent(at=now(), kind=kind, message=message, state=run.state, data=data))
    if data.get("type") in TYPES:  # an outside event: its webhooks (shared/runs/outbox.py)

        notify(ctx, run, str(data["type"]), message)


def _transition_message(before: RunState, run: RunRecord) -> str:
    return f"{before.value} -> {run.state.value}" + (f": {run.reason}" if run.reason else "")


def transition_event(ctx: Context, before: RunState, run: RunRecord) -> None:
    # At the change's own time (state_changed_at), so the event is the one pending_transition showed.
    ctx.store.events.add(run.id, RunEvent(at=run.state_changed_at, kind="transition",
                                          message=_transition_message(before, run), state=run.state))


def pending_transition(run: RunRecord, events: list[RunEvent]) -> RunEvent | None:
    """The run's last state change, as its transition event will read, when `events` lack it: the run and
    its events are in different tables (no transaction spans them), so the event is written just after the
    run, or never if the writer dies in between. The view adds it, so it never shows a state its history
    lacks."""
    if run.moved_from is None:
        return None
    if any(e.kind == "transition" and e.state == run.state and e.at >= run.state_changed_at for e in events):
        return None
    return RunEvent(at=run.state_changed_at, kind="transition", message=_transition_message(run.moved_from, run),
                    state=run.state)
