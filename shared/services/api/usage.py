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

from datetime import datetime, timedelta
from typing import Any

from shared.clock import now
from shared.context import Context
from shared.errors import InvalidInput
from shared.runs import budgets

# The computation lives in the run domain (webhooks and budgets price runs too); its names stay here.
from shared.runs.costs import MACHINE_STARTED as MACHINE_STARTED
from shared.runs.costs import MACHINE_STOPPED as MACHINE_STOPPED
from shared.runs.costs import Timing as Timing
from shared.runs.costs import timeline_events as timeline_events
from shared.runs.costs import timing
from shared.security import Principal


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


def usage(ctx: Context, principal: Principal, since: str | None) -> dict[str, Any]:
    """Runs launched since `since`, their GPU hours and cost, per provider and in total.

    A run counts in full (its whole cost so far) when it was launched at or after `since`.

    Reads the org's runs in pages (no events: the cost is on each record). Not bounded by `since`:
    the runs are keyed by creation, and a draft created long before `since` may have been launched
    after it; launched_at is not a column to filter on. One query of the records, however many.
    """
    start = parse_since(since)
    per: dict[str, dict[str, Any]] = {}
    for run in ctx.store.runs.in_org(principal.org):
        if run.launched_at is None or run.launched_at < start:
            continue
        t = timing(ctx, run)
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
    # This calendar month's budgets: billed, committed (billed + the most active runs can still cost), left,
    # the month's forecast (billed + the active runs' forecasts) and the thresholds crossed (shared/runs/budgets).
    return {"since": start.isoformat(), "providers": providers, "total": total,
            "budget": budgets.view(ctx, principal.org)}
