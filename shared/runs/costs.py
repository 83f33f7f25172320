"""A run's billed time and cost, from its record (RunRecord.billing) or, for a record from before it, from its
transition and audit events: the usage view's, the webhooks' and the budgets' one computation
(shared/services/api/usage.py tells the rules)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from shared.clock import now
from shared.context import Context
from shared.lifecycle import TERMINAL
from shared.models import Billing, RunEvent, RunRecord, RunState

# Audit lines that change whether a retained machine runs (recovery starts it; stop stops it).
MACHINE_STARTED = "machine start requested"
MACHINE_STOPPED = ("machine stopped", "machine stop requested")


@dataclass(frozen=True)
class Timing:
    started_at: datetime | None
    machine_up_at: datetime | None
    released_at: datetime | None
    elapsed_s: float | None
    machine_s: float
    disk_only_s: float
    cost: float
    final_cost: float | None
    machine_running: bool  # at the end of the timeline: False once stopped (disk kept) or released


def timeline_events(ctx: Context, run_id: str) -> list[RunEvent]:
    """The events the timeline needs (transitions and audit lines; never the log lines)."""
    return ctx.store.events.read(run_id, kind=("transition", "audit"))


def _release_confirmed_at(run: RunRecord, events: list[RunEvent]) -> datetime | None:
    """When the release was confirmed, for runs recorded before released_at existed."""
    if run.released_at or run.state not in TERMINAL or run.state == RunState.draft:
        return run.released_at
    ends = [e.at for e in events if e.kind == "transition" and e.message.startswith("releasing -> ")]
    return max(ends) if ends else None


def _machine_up_at(run: RunRecord, events: list[RunEvent]) -> datetime | None:
    if run.machine_up_at or not run.resources:
        return run.machine_up_at
    # Recorded before machine_up_at existed: the move to provisioning precedes the create call.
    ups = [e.at for e in events if e.kind == "transition" and e.message.startswith("queued -> provisioning")]
    return min(ups) if ups else run.launched_at


def _stops(e: RunEvent) -> bool:
    return (e.kind == "transition" and e.state == RunState.retained) or (
        e.kind == "audit" and (e.message.startswith(MACHINE_STOPPED) or e.data.get("machine") == "stopped"))


def _starts(e: RunEvent) -> bool:
    # A recovery start, or a resume (retained -> training: the machine started again to train).
    return (e.kind == "audit" and e.message.startswith(MACHINE_STARTED)) or (
        e.kind == "transition" and e.state == RunState.training and e.message.startswith("retained -> "))


def timing(ctx: Context, run: RunRecord, events: list[RunEvent] | None = None, at: datetime | None = None) -> Timing:
    """The run's time and cost now (`at`): from its record when it keeps its billing (no read), else
    from its transition/audit events (`events`, or read here)."""
    at = at or now()
    ended = run.state in TERMINAL
    if run.billing is not None:
        return _from_billing(run, run.billing, ended, at)
    events = sorted(events if events is not None else timeline_events(ctx, run.id), key=lambda e: e.at)
    up = _machine_up_at(run, events)
    released = _release_confirmed_at(run, events)
    end = released or (run.state_changed_at if ended else at)
    machine_s = disk_s = 0.0
    running = False
    if up is not None and end > up:
        machine_s, disk_s, running = _walk(events, up, end)
        if released is not None or ended:
            running = False
    return _timing(run, up, released, machine_s, disk_s, running, ended, at)


def _from_billing(run: RunRecord, b: Billing, ended: bool, at: datetime) -> Timing:
    """The run's time and cost from the billing its record keeps: the spans closed so far and the open one."""
    up, released = run.machine_up_at, run.released_at
    end = released or (run.state_changed_at if ended else at)
    machine_s, disk_s = b.machine_s, b.disk_only_s
    since = b.since or up
    if since is not None and end > since:
        if b.machine_running:
            machine_s += (end - since).total_seconds()
        else:
            disk_s += (end - since).total_seconds()
    running = up is not None and b.machine_running and released is None and not ended
    return _timing(run, up, released, machine_s, disk_s, running, ended, at)


def _walk(events: list[RunEvent], up: datetime, end: datetime) -> tuple[float, float, bool]:
    """The seconds the machine ran and the seconds only its disk was kept, from `up` to `end`, by the
    stops and starts on the timeline; and whether it was running at `end`."""
    machine_s = disk_s = 0.0
    running, cursor = True, up
    for e in events:
        if e.at <= up or e.at > end:
            continue
        stops, starts = _stops(e), _starts(e)
        if not (stops or starts):
            continue
        span = (e.at - cursor).total_seconds()
        if running:
            machine_s += span
        else:
            disk_s += span
        cursor, running = e.at, starts or (running and not stops)
    span = (end - cursor).total_seconds()
    if running:
        machine_s += span
    else:
        disk_s += span
    return machine_s, disk_s, running


def _timing(run: RunRecord, up: datetime | None, released: datetime | None, machine_s: float, disk_s: float,
            running: bool, ended: bool, at: datetime) -> Timing:
    offer = run.offer
    cost = round((machine_s * offer.total_per_hour + disk_s * offer.disk_per_hour) / 3600, 6)
    started = run.launched_at
    elapsed = None
    if started is not None:
        stop = released or (run.state_changed_at if ended else at)
        elapsed = max(0.0, (stop - started).total_seconds())
    return Timing(started_at=started, machine_up_at=up, released_at=released, elapsed_s=elapsed,
                  machine_s=round(machine_s, 3), disk_only_s=round(disk_s, 3), cost=cost,
                  final_cost=cost if ended else None, machine_running=running)
