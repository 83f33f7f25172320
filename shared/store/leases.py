"""Leases: one shape for every "only one of us does this for a while" in the control plane.

A lease is one row of the `leases` table, keyed by what it guards (`sweep~<org>~<provider>`, the
sweeper's fan-out cursor), with its own fields: `holder` (who took it), `until` (epoch seconds; it
ends by itself then, so a holder that died delays the work by at most the lease), and `data` (what
the holder wants the next taker to know: the last sweep's id and when it finished, a cursor).
Taken and ended by ETag-guarded writes, so of two takers that both read it free, one write is
refused. Nothing else lives in that table, and nothing else says how long a claim lasts.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from shared.clock import now_ts
from shared.errors import ConcurrencyError, Conflict

# Table keys may not hold / \ # ?; lease names are built from org ids and provider names.
_PK = "lease"


@dataclass
class Lease:
    name: str
    holder: str
    until: float
    etag: str
    data: dict[str, Any] = field(default_factory=dict)


def _table() -> Any:
    from shared.store import get_store

    return get_store().table("leases")


def take(name: str, hold_s: float) -> Lease | None:
    """Take the lease `name` for hold_s seconds: the lease, or None while someone else holds it."""
    table, t = _table(), now_ts()
    got = table.get(_PK, name)
    if got is not None and float(got[0].get("until", 0)) > t:
        return None
    data = dict(got[0].get("data", {})) if got else {}
    holder, until = secrets.token_hex(6), t + hold_s
    row = {"holder": holder, "until": until, "data": data}
    try:
        etag = table.insert(_PK, name, row) if got is None else table.update(_PK, name, row, got[1])
    except (ConcurrencyError, Conflict):
        return None  # taken by another between the read and the write
    return Lease(name, holder, until, etag, data)


def renew(lease: Lease, hold_s: float) -> bool:
    """Extend a held lease to hold_s from now (the holder is still working). False when it ran out and
    someone else took it: the holder must stop acting."""
    until = now_ts() + hold_s
    row = {"holder": lease.holder, "until": until, "data": lease.data}
    try:
        lease.etag = _table().update(_PK, lease.name, row, lease.etag)
    except ConcurrencyError:
        return False
    lease.until = until
    return True


def end(lease: Lease, **data: Any) -> bool:
    """End the lease now, keeping `data` (merged) for the next taker. False when it ran out and
    someone else holds it now (theirs to end; this holder's data is dropped)."""
    row = {"holder": "", "until": 0, "data": {**lease.data, **data}}
    try:
        _table().update(_PK, lease.name, row, lease.etag)
    except ConcurrencyError:
        return False
    return True
