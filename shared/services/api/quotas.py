"""Per-organization quotas and the run rate limit, so one org cannot run up cost or load without bound.

Owners set the org's limits (PUT /api/org/limits); every org has safe defaults until then.
Enforced in runs.create(), runs.patch() (a draft's edit) and runs.launch():
- price_limit_per_hour above max_price_limit_per_hour, or a runtime limit above
  max_runtime_limit_s: 422 naming the field (create, edit: shared/runs/admission.py's check_limits; launch);
- max_active_runs launched runs that are not finished yet (anything holding or about to
  hold a machine or disk): 409 at launch;
- more than runs_per_minute requests of one kind in one minute: 429 with Retry-After. The kinds:
  run creates and launches, and the other requests that make the control plane call a cloud or
  storage for the org (release retries, connection checks, recoveries, dataset upload URLs, dataset
  uploads and commits); metrics reads at HEAVY_READS_PER_RUN times that.
The retention limit (retention_limit_s) is held by heartbeat-check: a retained run is warned, then
discarded (shared/runs/retention.py).

The rate limit is a fixed one-minute window counted in the `quotas` table with ETag-guarded
writes, so it holds across host instances (a per-process counter would not). max_active_runs
is a reservation per launched run in one ETag-guarded row of that table
(store.slots.reserve): reading a count and then writing the launch would let concurrent
launches all see the same free slot and all start. The reservation is freed when the run ends
(the store, on its move to a terminal state) or when the launch that took it fails.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from shared.clock import now, now_ts
from shared.context import Context
from shared.errors import ConcurrencyError, Conflict, InvalidInput, NotFound, TooManyRequests, invalid
from shared.lifecycle import HOLDS_MACHINE
from shared.models import Role, RunRecord, RunState
from shared.runs.admission import check_limits
from shared.runs.org_limits import LIMITS_KEY as LIMITS_KEY
from shared.runs.org_limits import LimitsAnswer, OrgLimits, get_limits, over_ceilings
from shared.runs.org_limits import set_limits as set_limits
from shared.runs.retention import affected_by
from shared.security import Principal, require

# The limits themselves (OrgLimits, get_limits, set_limits) live in shared/runs/org_limits.py, where
# heartbeat-check reads the retention limit too.
WINDOW_S = 60
# Losing the ETag race means another request of the same window was counted: retrying is bounded by
# the window's capacity (once full, the answer is an honest 429), plus a few for a window's rollover.
EXTRA_RACE_RETRIES = 16


def view(ctx: Context, principal: Principal) -> OrgLimits:
    return get_limits(ctx, principal.org)


def put(ctx: Context, principal: Principal, body: Any) -> LimitsAnswer:
    """Save the org's limits. A lowered retention limit discards nothing at once: the answer lists the retained
    runs it brings forward, and heartbeat-check warns each before it discards it (shared/runs/retention.py)."""
    require(principal, Role.owner)
    if not isinstance(body, dict):
        raise InvalidInput.field("body", "send the limits as a JSON object")
    old = get_limits(ctx, principal.org)
    sent = {k: v for k, v in body.items() if k != "retention_affects"}  # an earlier answer sent back as is
    errors = over_ceilings(ctx, sent)
    if errors:
        raise InvalidInput("; ".join(f"{e['field']}: {e['message']}" for e in errors), errors=errors)
    try:
        # Fields left out keep their current value.
        limits = OrgLimits.model_validate(old.model_dump() | sent)
    except ValidationError as exc:
        raise invalid(exc) from exc
    ctx.store.audit.add("org limits set", org=principal.org, by=principal.sub, **limits.model_dump())
    set_limits(ctx, principal.org, limits)
    affected = []
    if limits.retention_limit_s < old.retention_limit_s:
        retained = ctx.store.runs.in_org(principal.org, {RunState.retained})
        affected = affected_by(retained, old, limits, now())
    return LimitsAnswer(**limits.model_dump(), retention_affects=affected)


def _take(ctx: Context, org: str, action: str, per_minute: int) -> None:
    """Count one `action` in this minute's window; 429 only when the window is full."""
    table = ctx.store.table("quotas")
    key = f"rate-{action}"
    for _ in range(per_minute + EXTRA_RACE_RETRIES):
        t = now_ts()
        window = int(t // WINDOW_S)
        got = table.get(org, key)
        count = int(got[0].get("count", 0)) if got and got[0].get("window") == window else 0
        if count >= per_minute:
            retry = int((window + 1) * WINDOW_S - t) + 1
            raise TooManyRequests(f"more than {per_minute} {_WHAT.get(action, action)} in a minute for this "
                                  f"organization; try again in {retry} s (an owner sets runs_per_minute under "
                                  "/api/org/limits)", retry_after_s=retry)
        data = {"window": window, "count": count + 1}
        try:
            if got is None:
                table.insert(org, key, data)
            else:
                table.update(org, key, data, got[1])
            return
        except (ConcurrencyError, Conflict):
            continue  # another instance counted meanwhile: read again
    raise TooManyRequests("too many requests at once for this organization; try again", retry_after_s=1)


_WHAT = {"create": "run creates", "launch": "run launches", "release": "release retries",
         "check": "connection checks", "recover": "recoveries", "upload-url": "dataset upload URLs",
         "upload": "uploads (datasets, their commits, recovery archives)", "metrics": "metrics reads"}
# Reads that cost the control plane a lot (a run's metrics parse up to METRIC_LINES of its log: 40 MB a call
# raised another org's median latency from 38 to 392 ms) are limited too, at this many per runs_per_minute:
# a page that polls a run's chart every few seconds stays under it.
HEAVY_READS_PER_RUN = 6


def take(ctx: Context, principal: Principal, action: str) -> None:
    """The org's rate limit for one more `action` (a key of _WHAT)."""
    _take(ctx, principal.org, action, get_limits(ctx, principal.org).runs_per_minute)


def take_read(ctx: Context, principal: Principal, action: str) -> None:
    """The org's rate limit for one more heavy read `action` (HEAVY_READS_PER_RUN per runs_per_minute)."""
    _take(ctx, principal.org, action, get_limits(ctx, principal.org).runs_per_minute * HEAVY_READS_PER_RUN)


def take_create(ctx: Context, principal: Principal, limits: OrgLimits) -> None:
    """The run rate limit for one more create (admission calls it once the org's limits pass)."""
    _take(ctx, principal.org, "create", limits.runs_per_minute)


def check_launch(ctx: Context, principal: Principal, run: RunRecord) -> OrgLimits:
    limits = get_limits(ctx, principal.org)
    check_limits(limits, run.price_limit_per_hour, run.runtime_limit_s)  # limits may have changed since
    return limits


def reserve_active(ctx: Context, principal: Principal, run: RunRecord, limits: OrgLimits) -> bool:
    """Take one of the org's max_active_runs slots for this run, or 409. Returns whether this
    call took it (False: the run held one already, from a launch attempt of it under way or
    one that died); a launch that fails after taking its slot frees it (free_unless_launched)."""
    slot = ctx.store.slots.reserve(principal.org, run.id, limits.max_active_runs)
    if not slot.granted:
        raise Conflict(f"nothing was launched: the organization has {slot.active} launched runs that are not "
                       f"finished (limit {limits.max_active_runs}); wait for one to finish, cancel one, or an "
                       "owner raises max_active_runs under /api/org/limits")
    return slot.added


def take_launch(ctx: Context, principal: Principal, limits: OrgLimits) -> None:
    _take(ctx, principal.org, "launch", limits.runs_per_minute)


def free_unless_launched(ctx: Context, org: str, run_id: str) -> None:
    """After a launch failed: free the run's slot unless the run holds a machine after all (a
    concurrent launch of the same run won, or the write landed before the error)."""
    store = ctx.store
    try:
        run, _ = store.runs.get(org, run_id)
    except NotFound:
        run = None
    if run is None or run.state not in HOLDS_MACHINE:
        store.slots.release(org, run_id)
