"""Record ids: a prefix saying what the record is (p: project, d: dataset version, r: run) and
random hex digits, unguessable and short enough to type.

Run ids sort newest first: the runs partition's RowKey is the run id, and a list of runs reads the
partition in key order, a page at a time (GET /api/runs). So a run id starts with the time of its
creation, inverted (NEWEST_FIRST_SPAN minus epoch milliseconds, 9 base-36 digits), then 8 random hex
digits. In base 36 those 9 digits begin with a letter from NEWEST_FIRST_FROM up to 'z' for the next
thousand years, while run ids from before this scheme ("r-" + 12 hex digits) begin with 0-9 or a-f:
the two never mix, and a list reads the new range first, then the old one (store.runs.page).
"""

from __future__ import annotations

import secrets

from shared.clock import now_ts

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
NEWEST_FIRST_SPAN = 36**9  # milliseconds: about 3,200 years after 1970
NEWEST_FIRST_FROM = "g"  # every newest-first id's first character after the prefix is >= this


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def newest_first_id(prefix: str) -> str:
    """An id whose key order is newest first (by the simulated clock in tests); ids made in the
    same millisecond sort by their random part."""
    n = NEWEST_FIRST_SPAN - int(now_ts() * 1000)
    digits = ""
    for _ in range(9):
        n, d = divmod(n, 36)
        digits = _DIGITS[d] + digits
    return f"{prefix}-{digits}{secrets.token_hex(4)}"
