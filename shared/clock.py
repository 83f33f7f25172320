"""One clock for the whole core, so tests (and the chaos test) can simulate time."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

_now: Callable[[], float] = time.time


def now_ts() -> float:
    return _now()


def now() -> datetime:
    return datetime.fromtimestamp(_now(), tz=UTC)


def set_clock(fn: Callable[[], float] | None) -> None:
    """Replace the clock (tests only); None restores the wall clock."""
    global _now
    _now = fn or time.time


class FakeClock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float | timedelta) -> None:
        self.t += seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
