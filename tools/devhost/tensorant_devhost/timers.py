"""Timer triggers: fire on their NCRONTAB schedules (seconds first) or TimeSpans; runOnStartup honoured."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from tensorant_devhost.config import timespan_s
from tensorant_devhost.functions import FunctionInfo, resolve_setting
from tensorant_devhost.invocation import Invoker
from tensorant_devhost.logger import log


def next_fire(schedule: str, after: datetime) -> datetime:
    """Next occurrence of an NCRONTAB (6 fields, seconds first; 5 fields accepted) or a TimeSpan schedule."""
    schedule = resolve_setting(schedule).strip()
    if ":" in schedule and " " not in schedule:
        period = timespan_s(schedule, 0)
        if period <= 0:
            raise ValueError(f"timer schedule {schedule!r} must be positive")
        return datetime.fromtimestamp(after.timestamp() + period, tz=UTC)
    from croniter import croniter

    fields = schedule.split()
    if len(fields) not in (5, 6):
        raise ValueError(f"timer schedule {schedule!r} is not NCRONTAB ({{second}} {{minute}} {{hour}} ...)")
    it = croniter(schedule, after, second_at_beginning=len(fields) == 6)
    result: datetime = it.get_next(datetime)
    return result


class TimerTriggers(Invoker):
    def run_timer(self, name: str, past_due: bool = False) -> None:
        from azure.functions.timer import TimerRequest

        f = next(x for x in self.functions if x.kind == "timer" and x.name == name)
        self.invoke(f, TimerRequest(past_due=past_due, schedule={"AdjustForDST": True}), f"timer {f.schedule}")

    def _timer_loop(self, f: FunctionInfo) -> None:
        if f.run_on_startup:
            self._fire(f, False)
        nxt = next_fire(f.schedule, datetime.now(UTC))
        while not self._stop.is_set():
            wait_s = nxt.timestamp() - time.time()
            if wait_s > 0:
                self._stop.wait(min(wait_s, 1.0))
                continue
            self._fire(f, past_due=wait_s < -1.0)
            nxt = next_fire(f.schedule, max(datetime.now(UTC), nxt))

    def _fire(self, f: FunctionInfo, past_due: bool) -> None:
        try:
            self.run_timer(f.name, past_due)
        except Exception as exc:  # the schedule goes on
            if not getattr(exc, "_devhost_logged", False):
                log.error("timer %s: could not fire: %s: %s", f.name, type(exc).__name__, exc)
