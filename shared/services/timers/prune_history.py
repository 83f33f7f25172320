"""prune-history: what an ended run leaves in the tables is bounded by its organization's retention.

A run that ended more than its org's retention limit ago (OrgLimits.retention_limit_s, 14 days by default:
the same limit that bounds how long a retained machine is kept) loses its timeline (events) and its agent
log lines; its run record (state, reason, cost, billed time) and its ledger (every cloud resource it ever
recorded) are kept, as are the audit rows. The run view then shows one event saying so.

Which runs are due is an index written as each run ends (store.ended), keyed by when its prune is due, so
a tick reads only what is due. Each tick prunes at most PER_TICK runs, within the timer's own budget; the
timer fires hourly, so a run's history is pruned within its retention plus an hour (more only where more
than PER_TICK runs an hour come due: the rest wait for the next tick, oldest first).
"""

from __future__ import annotations

from shared.budget import invocation_bound_s
from shared.clock import now, now_ts
from shared.context import Context
from shared.models import RunEvent
from shared.runs.org_limits import OrgLimits, get_limits

PER_TICK = 500
# What a tick may spend before leaving the rest to the next one (under its invocation bound).
BUDGET_S = 60.0


def prune_all(ctx: Context) -> dict[str, int]:
    store, started = ctx.store, now_ts()
    budget = min(BUDGET_S, invocation_bound_s() / 2)
    counts = {"due": 0, "pruned": 0, "later": 0, "rows_deleted": 0}
    limits: dict[str, OrgLimits] = {}
    for row in store.ended.due(started, PER_TICK):
        if now_ts() - started > budget:
            break
        counts["due"] += 1
        if row.org not in limits:
            limits[row.org] = get_limits(ctx, row.org)
        due = row.ended_at + limits[row.org].retention_limit_s
        if due > now_ts():
            store.ended.later(row, due)  # the org keeps history longer than the first look
            counts["later"] += 1
            continue
        counts["rows_deleted"] += store.events.prune(row.run_id) + store.logs.prune(row.run_id)
        days = limits[row.org].retention_limit_s / 86400
        store.events.add(row.run_id, RunEvent(at=now(), kind="audit", message=(
            f"events and log lines pruned: the run ended more than the organization's retention limit of {days:g} "
            "days ago (retention_limit_s); the run's record, cost and resource ledger are kept")))
        store.ended.done(row)
        counts["pruned"] += 1
    return counts
