"""Fixtures the sweeper, heartbeat-check and poison tests share: a harness on the chaos provider."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests import fakes
from tests.chaos.provider import ChaosCloud, install_chaos_provider, uninstall_chaos_provider
from tests.harness import Harness


@pytest.fixture
def cloud() -> Iterator[ChaosCloud]:
    c = ChaosCloud()
    install_chaos_provider(c)
    yield c
    uninstall_chaos_provider()


# The harness fixture is the memory one; it takes whichever `cloud` fixture is in scope.
h = fakes.h


def audits(action: str) -> list[dict[str, Any]]:
    from shared.store import get_store

    return [a for a in get_store().list_audit() if a["action"] == action]


def sweep(h: Harness, dry_run: bool = False) -> Any:
    return h.ok("POST", "/api/platform/sweep", token="admin", json_body={"dry_run": dry_run})
