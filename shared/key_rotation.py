"""When the JWT key in use became current, so a rotation cannot launder forged tokens.

During a rotation `TENSORANT_JWT_SECRET_PREVIOUS` is still accepted, and an agent on it is handed a
token on the new key. The previous key is rotated out because it may have leaked: a token freshly
forged with it must not be renewed onto the new key, where it would outlive the previous key's removal.
So a previous-key token is renewed only when it was issued before the current key was first seen.

That time is derived, not set by the operator (the rotation is two Key Vault writes and a restart,
README "Deploying", and the app settings are the template's): the first process that handles an agent
(a launch minting a bootstrap token, any heartbeat) with a key records, once, when it first saw that
key (`keys` table, one row per key id, insert-if-absent: the earliest record wins); every process
keeps the answer in memory. A run launched after the rotation has its launch recorded at or after that
time, and a renewable token must not predate its run's launch, so no token can be forged for it.
"""

from __future__ import annotations

import hashlib
import math
import threading
from datetime import datetime

from shared.clock import now_ts
from shared.context import Context
from shared.errors import Conflict

_PK = "jwt"
_seen: dict[tuple[str, str], float] = {}
_lock = threading.Lock()


def key_id(secret: str) -> str:
    """A name for a key that says nothing about it (the table holds no secret)."""
    return hashlib.sha256(b"tensorant-jwt-key-id\0" + secret.encode()).hexdigest()[:32]


def current_key_since(ctx: Context) -> float:
    """Epoch seconds at which the current JWT key was first seen by this deployment (recorded now
    if never): one point read per process and key, one insert the first time."""
    store = ctx.store
    kid = key_id(ctx.settings.jwt_secret)
    cache_key = (store.prefix, kid)
    with _lock:
        if cache_key in _seen:
            return _seen[cache_key]
    table = store.table("keys")
    got = table.get(_PK, kid)
    if got is None:
        try:
            table.insert(_PK, kid, {"first_seen": now_ts()})
        except Conflict:
            pass  # another process recorded it first: its time stands
        got = table.get(_PK, kid)
    since = float(got[0]["first_seen"]) if got else now_ts()
    with _lock:
        _seen[cache_key] = since
    return since


def renewable(ctx: Context, issued_at: float, previous_key: bool, launched_at: datetime | None) -> bool:
    """Whether a verified agent token may be renewed onto the current key. A current-key token always
    may. A previous-key one only if it was issued before the current key was first seen (a token
    issued later was forged with the rotated-out key) and not before its run was launched (a token
    cannot predate its run: the bootstrap token is minted by the launch)."""
    if not previous_key:
        return True
    if launched_at is None or not math.isfinite(issued_at):
        return False
    # iat is whole seconds (minted as int(now)), so a token minted within the launch's second is allowed.
    return math.floor(launched_at.timestamp()) <= issued_at < current_key_since(ctx)
