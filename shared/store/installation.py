"""This state store's installation id: a random id made once per state store (its tables), marked on
every cloud resource the control plane creates (the `tensorant:store` tag, shared/providers/base.py).

Two control planes that share a TENSORANT_DEPLOYMENT_ID and a cloud account (a staging copy left on
the production id) would each take the other's machines for leaks: "its run is missing". With the
mark, the sweeper sees a resource of its deployment made by another state store and refuses to sweep
that account, loudly, until one of them changes its deployment id
(shared/services/steps/sweep_account.py).
"""

from __future__ import annotations

import secrets
import threading
from typing import TYPE_CHECKING

from shared.errors import Conflict

# For typing only: shared.context imports the store (a cycle).
if TYPE_CHECKING:
    from shared.context import Context

_ROW = ("~installation", "id")
_lock = threading.Lock()
_cached: dict[str, str] = {}


def installation_id(ctx: Context) -> str:
    """Made on first use (an insert: of two processes racing, both read the winner's), then cached
    per store (its table prefix)."""
    store = ctx.store
    key = f"{id(store)}:{store.prefix}"
    with _lock:
        if key in _cached:
            return _cached[key]
    table = store.table("leases")
    got = table.get(*_ROW)
    if got is None:
        try:
            table.insert(*_ROW, {"id": secrets.token_hex(6)})
        except Conflict:
            pass
        got = table.get(*_ROW)
    assert got is not None
    value = str(got[0]["id"])
    with _lock:
        _cached[key] = value
    return value
