"""Record ids: a prefix saying what the record is (p: project, d: dataset version, r: run) and
12 random hex digits, unguessable and short enough to type."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"
