"""Time and cost of runs: one run's billing timeline, and the org's usage summary.

Billed machine time runs from the create call (machine_up_at, written by the launch step) to
the cloud's confirmed release (released_at, written by the release step). Within it, the time
the machine was stopped with only its disk kept (entering `retained`, until a recovery start)
is counted apart as disk-only time. Both are kept on the run's record (RunRecord.billing,
shared/runs/billing.py: updated in the writes that stop or start the machine), so a run's cost needs
no read of its events; a record from before that derives them from its transition and audit events
(timeline_events). Money is the price recorded at launch: the offer's total_per_hour while the
machine runs, its disk_per_hour while only the disk is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.clock import now
from shared.errors import InvalidInput
from shared.lifecycle import TERMINAL
from shared.models import RunEvent, RunRecord, RunState
from shared.security import Principal
from shared.store import get_store

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


def timeline_events(run_id: str) -> list[RunEvent]:
    """The events the timeline needs (transitions and audit lines; never the log lines)."""
    return get_store().events.read(run_id, kind=("transition", "audit"))


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


def timing(run: RunRecord, events: list[RunEvent] | None = None, at: datetime | None = None) -> Timing:
    """The run's time and cost now (`at`): from its record when it keeps its billing (no read), else
    from its transition/audit events (`events`, or read here)."""
    at = at or now()
    ended = run.state in TERMINAL
    b = run.billing
    machine_s = disk_s = 0.0
    running = False
    if b is not None:
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
    events = sorted(events if events is not None else timeline_events(run.id), key=lambda e: e.at)
    up = _machine_up_at(run, events)
    released = _release_confirmed_at(run, events)
    end = released or (run.state_changed_at if ended else at)
    if up is not None and end > up:
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
        if released is not None or ended:
            running = False
    return _timing(run, up, released, machine_s, disk_s, running, ended, at)


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


def parse_since(since: str | None) -> datetime:
    """An ISO date or date-time; default 30 days ago."""
    if not since:
        return now() - timedelta(days=30)
    try:
        parsed = datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput.field("since", f"{since!r} is not an ISO date (e.g. 2026-01-31 or "
                                 "2026-01-31T12:00:00Z)") from exc
    if parsed.tzinfo is None:
        from datetime import UTC

        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def usage(principal: Principal, since: str | None) -> dict[str, Any]:
    """Runs launched since `since`, their GPU hours and cost, per provider and in total.

    A run counts in full (its whole cost so far) when it was launched at or after `since`.

    Reads the org's runs in pages (no events: the cost is on each record). Not bounded by `since`:
    the runs are keyed by creation, and a draft created long before `since` may have been launched
    after it; launched_at is not a column to filter on. One query of the records, however many.
    """
    start = parse_since(since)
    per: dict[str, dict[str, Any]] = {}
    for run in get_store().runs.in_org(principal.org):
        if run.launched_at is None or run.launched_at < start:
            continue
        t = timing(run)
        row = per.setdefault(run.provider, {"provider": run.provider, "runs": 0, "gpu_hours": 0.0, "cost": 0.0,
                                            "currency": run.offer.currency, "checkpoint_adapters": 0})
        row["runs"] += 1
        # Runs that ended with a checkpoint's adapter (accepted at a recovery), not a completed training.
        row["checkpoint_adapters"] += 1 if run.adapter_kind == "checkpoint" else 0
        row["gpu_hours"] += t.machine_s * max(1, run.offer.gpu_count) / 3600
        row["cost"] += t.cost
    providers = sorted(per.values(), key=lambda r: r["provider"])
    for row in providers:
        row["gpu_hours"], row["cost"] = round(row["gpu_hours"], 4), round(row["cost"], 4)
    total = {"runs": sum(r["runs"] for r in providers),
             "checkpoint_adapters": sum(r["checkpoint_adapters"] for r in providers),
             "gpu_hours": round(sum(r["gpu_hours"] for r in providers), 4),
             "cost": round(sum(r["cost"] for r in providers), 4)}
    return {"since": start.isoformat(), "providers": providers, "total": total}
