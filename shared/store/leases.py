"""Claims: one shape for every "only one of us does this for a while" in the control plane.

A claim is held from when it was taken until `ends(since, hold_s)`, and is free once `left(until)` is 0: one
rule, on the core's clock (shared/clock.py), for every claim below.

A lease is a claim in its own row of the `leases` table, keyed by what it guards (`sweep~<org>~<provider>`,
the sweeper's fan-out cursor), with its own fields: `holder` (who took it), `until` (epoch seconds; it
ends by itself then, so a holder that died delays the work by at most the lease), and `data` (what
the holder wants the next taker to know: the last sweep's id and when it finished, a cursor).
Taken and ended by ETag-guarded writes, so of two takers that both read it free, one write is
refused. Nothing else lives in that table.

A claim that must be decided in the same write as another record stamps its start in that record (its
ETag guards it the same way): the launch claim on the run (claim_launch below), an org's active-run and
budget reservations (shared/store/slots.py, shared/runs/budgets.py). Powertools' Idempotency utility
cannot be this primitive: docs/architecture.md says why.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from shared.clock import now, now_ts
from shared.errors import ConcurrencyError, Conflict
from shared.models import RunRecord, RunState

# For typing only: shared.context imports the store (a cycle).
if TYPE_CHECKING:
    from shared.context import Context

# Table keys may not hold / \ # ?; lease names are built from org ids and provider names.
_PK = "lease"


def ends(since: float | datetime, hold_s: float) -> float:
    """When a claim taken at `since` (epoch seconds, or a time) for hold_s seconds ends (epoch seconds)."""
    return (since.timestamp() if isinstance(since, datetime) else float(since)) + hold_s


def left(until: float) -> float:
    """Seconds until a claim that ends at `until` is free: 0 once it is (held while now < until)."""
    return max(0.0, until - now_ts())


@dataclass
class Lease:
    name: str
    holder: str
    until: float
    etag: str
    data: dict[str, Any] = field(default_factory=dict)


def _table(ctx: Context) -> Any:
    return ctx.store.table("leases")


def take(ctx: Context, name: str, hold_s: float) -> Lease | None:
    """Take the lease `name` for hold_s seconds: the lease, or None while someone else holds it."""
    table = _table(ctx)
    got = table.get(_PK, name)
    if got is not None and left(float(got[0].get("until", 0))) > 0:
        return None
    data = dict(got[0].get("data", {})) if got else {}
    holder, until = secrets.token_hex(6), ends(now_ts(), hold_s)
    row = {"holder": holder, "until": until, "data": data}
    try:
        etag = table.insert(_PK, name, row) if got is None else table.update(_PK, name, row, got[1])
    except (ConcurrencyError, Conflict):
        return None  # taken by another between the read and the write
    return Lease(name, holder, until, etag, data)


def renew(ctx: Context, lease: Lease, hold_s: float) -> bool:
    """Extend a held lease to hold_s from now (the holder is still working). False when it ran out and
    someone else took it: the holder must stop acting."""
    until = ends(now_ts(), hold_s)
    row = {"holder": lease.holder, "until": until, "data": lease.data}
    try:
        lease.etag = _table(ctx).update(_PK, lease.name, row, lease.etag)
    except ConcurrencyError:
        return False
    lease.until = until
    return True


def end(ctx: Context, lease: Lease, **data: Any) -> bool:
    """End the lease now, keeping `data` (merged) for the next taker. False when it ran out and
    someone else holds it now (theirs to end; this holder's data is dropped)."""
    row = {"holder": "", "until": 0, "data": {**lease.data, **data}}
    try:
        _table(ctx).update(_PK, lease.name, row, lease.etag)
    except ConcurrencyError:
        return False
    return True


def launch_claim_left(run: RunRecord, settle_s: float) -> float:
    """Seconds until the run's next launch claim is due: its last one (the move to provisioning is the
    first; a record from before the field: its last write) holds for settle_s."""
    return left(ends(run.launch_claimed_at or run.updated_at, settle_s))


def claim_launch(ctx: Context, org: str, run_id: str, *, settle_s: float) -> tuple[RunRecord, bool]:
    """Claim a provisioning run with no recorded resources for one create attempt.

    The claim is its own field of the run (launch_claimed_at), written by the run's one write with its
    ETag, so it is granted only to a run still provisioning without resources, and only settle_s after
    the previous claim: a create that crashed or timed out may have made a machine that listing does not
    show yet, so two attempts closer together could each create one. Other writes (a heartbeat, a note)
    do not extend it. Returns (run as stored now, whether this call claimed it).
    """
    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.provisioning or r.resources or launch_claim_left(r, settle_s) > 0:
            return None
        return r.model_copy(update={"launch_claimed_at": now(), "updated_at": now()})

    return ctx.store.runs.mutate(org, run_id, change)


def end_launch_claim(ctx: Context, run: RunRecord, *, settle_s: float, lag_s: float) -> bool:
    """The claiming invocation is over and its create was answered (the cloud is still working on it): the
    next claim need not wait out the rest of this invocation's bound, only lag_s from now for what the
    create made to show in listings. Ends only the claim `run` holds (its stamp as claimed), and never later
    than it would have. Returns whether it was written."""
    stamp = run.launch_claimed_at
    if stamp is None:
        return False
    sooner = now() - timedelta(seconds=settle_s - lag_s)

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.provisioning or r.resources or r.launch_claimed_at != stamp or sooner >= stamp:
            return None
        return r.model_copy(update={"launch_claimed_at": sooner})

    return ctx.store.runs.mutate(run.org, run.id, change)[1]
