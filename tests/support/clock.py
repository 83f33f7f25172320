"""A simulated clock for shared.clock.set_clock: time moves only when a test advances it."""

from __future__ import annotations

from datetime import timedelta


class FakeClock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float | timedelta) -> None:
        self.t += seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
