"""The keys every repository reads and writes under, checked before a call reaches the service: a
per-org call names one valid org, an id that cannot be a table key names nothing."""

from __future__ import annotations

import re
import secrets

from shared.clock import now_ts
from shared.errors import NotFound
from shared.models import KEY_PATTERN, ORG_PATTERN

_ORG = re.compile(ORG_PATTERN)
_KEY = re.compile(KEY_PATTERN)


def org_key(org: object) -> str:
    """Every per-org call names one org: an empty or malformed org is a bug, never "all orgs"."""
    if not isinstance(org, str) or not _ORG.fullmatch(org):
        raise ValueError(f"a store call needs one valid org, not {org!r:.80}")
    return org


def id_key(value: str, what: str) -> str:
    """An id that cannot be a table key (/, #, ?, \\, control characters, too long) names nothing."""
    if not isinstance(value, str) or not _KEY.fullmatch(value):
        raise NotFound(f"{what} not found")
    return value


def row_key(key: str) -> str:
    # Table keys may not contain / \ # ?
    return key.replace(":", "~").replace("/", "|")


def time_key() -> str:
    """A RowKey in time order (microseconds), unique among writers at the same microsecond."""
    return f"{int(now_ts() * 1_000_000):020d}-{secrets.token_hex(3)}"
