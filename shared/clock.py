"""One clock for the whole core, so tests (and the chaos test) can simulate time."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

_now: Callable[[], float] = time.time


def now_ts() -> float:
    return _now()


def now() -> datetime:
    return datetime.fromtimestamp(_now(), tz=UTC)


def set_clock(fn: Callable[[], float] | None) -> None:
    """Replace the clock (tests: tests/support/clock.FakeClock); None restores the wall clock."""
    global _now
    _now = fn or time.time

