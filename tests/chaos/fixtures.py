"""Helpers the sweeper, heartbeat-check and poison tests share. Their harness is the shared `harness` on the
chaos provider (each of those modules overrides tests/conftest.py's `cloud` with it)."""

from __future__ import annotations

from typing import Any

from tests.harness import Harness


def audits(action: str) -> list[dict[str, Any]]:
    from shared.store import get_store

    return [a for a in get_store().audit.read() if a["action"] == action]


def sweep(harness: Harness, dry_run: bool = False) -> Any:
    """An admin's sweep as an admin sees it: started (202, one message per account), the queues
    drained, then its report (every account's findings)."""
    started = harness.ok("POST", "/api/platform/sweep", token="admin", json_body={"dry_run": dry_run})
    harness.drain()
    out = harness.ok("GET", started["status_url"], token="admin")
    assert out["finished"], out
    return out
