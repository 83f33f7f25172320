"""Paginated lists: `limit` (default DEFAULT_LIMIT, at most MAX_LIMIT) and `cursor` (the `next` of the
previous page; null on the last page), the same on every list of the API.

A cursor is the RowKey the next page starts at, opaque and signed: base64url of the key, then an
HMAC over the list's name, the caller's org, the list's filters and the key (the JWT signing key,
so a rotation restarts lists). A cursor is only ever read inside the caller's own partition (the
filter names the org, and the key is a lower bound within it), so it cannot reach another org even
if forged; the signature only makes a changed or moved cursor (another list, other filters) a 400
naming `cursor` instead of a page of something else. Cursors of the old key are refused after a
rotation (start the list again).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

from shared.context import Context
from shared.errors import AppError, InvalidInput

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
MAX_CURSOR_CHARS = 400  # a RowKey is at most 1 KiB; ours are under 100 characters
_SIG_CHARS = 22  # 16 bytes of the HMAC, base64url


@dataclass(frozen=True)
class PageRequest:
    limit: int
    after: str | None  # the RowKey to start at (inclusive), from the cursor


def _key(ctx: Context) -> bytes:
    return hashlib.sha256(b"tensorant list cursor\0" + ctx.settings.jwt_secret.encode()).digest()


def _sign(ctx: Context, scope: tuple[str, ...], row_key: str) -> str:
    msg = "\0".join((*scope, row_key)).encode()
    return base64.urlsafe_b64encode(hmac.new(_key(ctx), msg, hashlib.sha256).digest()[:16]).decode().rstrip("=")


def bad_cursor(why: str) -> AppError:
    return AppError(f"cursor: {why}; send the `next` of the previous page unchanged, or none for the first page",
                    errors=[{"field": "cursor", "message": why}])


def request(ctx: Context, limit: str | None, cursor: str | None, *scope: str) -> PageRequest:
    """The page asked for. `scope`: the list's name, the caller's org and its filters, as the cursor was
    signed for them. A bad limit is 422 naming `limit`; a bad cursor is 400 naming `cursor`."""
    if limit is None or limit == "":
        count = DEFAULT_LIMIT
    elif limit.isascii() and limit.isdigit() and len(limit) <= 4 and 1 <= int(limit) <= MAX_LIMIT:
        count = int(limit)
    else:
        raise InvalidInput.field("limit", f"a whole number from 1 to {MAX_LIMIT}")
    if cursor is None or cursor == "":
        return PageRequest(count, None)
    if len(cursor) > MAX_CURSOR_CHARS or not cursor.isascii() or "." not in cursor:
        raise bad_cursor("not a cursor this API made")
    body, sig = cursor.rsplit(".", 1)
    try:
        row_key = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except (binascii.Error, ValueError):
        raise bad_cursor("not a cursor this API made") from None
    if len(sig) != _SIG_CHARS or not hmac.compare_digest(sig, _sign(ctx, scope, row_key)):
        raise bad_cursor("not a cursor of this list with these filters (changed, another list's, or from "
                         "before a key rotation)")
    return PageRequest(count, row_key)


def cursor_for(ctx: Context, row_key: str | None, *scope: str) -> str | None:
    """The `next` of a page: None at the end."""
    if row_key is None:
        return None
    body = base64.urlsafe_b64encode(row_key.encode()).decode().rstrip("=")
    return f"{body}.{_sign(ctx, scope, row_key)}"
