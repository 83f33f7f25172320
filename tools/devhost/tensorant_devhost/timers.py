"""Timer triggers: fire on their NCRONTAB schedules (seconds first) or TimeSpans; runOnStartup honoured;
a missed occurrence runs once, past due, after a restart (useMonitor)."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    """Timers as the real host runs them with useMonitor (its default): each timer's last and next
    occurrence are recorded (the host keeps them in a blob, azure-webjobs-hosts/timers/...; here a
    file under .tensorant/devhost/timers/), and at start an occurrence missed while no host ran is
    run once, past due. A changed schedule starts over, as the host's monitor does."""

    def run_timer(self, name: str, past_due: bool = False) -> None:
        from azure.functions.timer import TimerRequest

        f = next(x for x in self.functions if x.kind == "timer" and x.name == name)
        self.invoke(f, TimerRequest(past_due=past_due, schedule={"AdjustForDST": True}), f"timer {f.schedule}")

    def _timer_loop(self, f: FunctionInfo) -> None:
        nxt, past_due = self._timer_start(f)
        if past_due or f.run_on_startup:
            self._fire(f, past_due)
            now = datetime.now(UTC)
            nxt = next_fire(f.schedule, now)
            self._save_status(f, now, nxt)
        while not self._stop.is_set():
            wait_s = nxt.timestamp() - time.time()
            if wait_s > 0:
                self._stop.wait(min(wait_s, 1.0))
                continue
            self._fire(f, past_due=wait_s < -1.0)
            last, nxt = nxt, next_fire(f.schedule, max(datetime.now(UTC), nxt))
            self._save_status(f, last, nxt)

    def _timer_start(self, f: FunctionInfo) -> tuple[datetime, bool]:
        """The next occurrence and whether it is past due (missed while no host ran)."""
        now = datetime.now(UTC)
        status = self._load_status(f)
        if status is None or status.get("Schedule") != resolve_setting(f.schedule):
            nxt = next_fire(f.schedule, now)
            self._save_status(f, None, nxt)
            return nxt, False
        nxt = datetime.fromisoformat(status["Next"])
        if nxt < now:
            log.info("timer %s: the occurrence of %s was missed (no host ran); running it now, past due",
                     f.name, nxt.isoformat())
            return nxt, True
        return nxt, False

    def _status_path(self, f: FunctionInfo) -> Path:
        return self.root / ".tensorant" / "devhost" / "timers" / f"{f.name}.status.json"

    def _load_status(self, f: FunctionInfo) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self._status_path(f).read_text())
            datetime.fromisoformat(data["Next"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none yet, or unreadable: start over, as the host does without a status blob
        return data

    def _save_status(self, f: FunctionInfo, last: datetime | None, nxt: datetime) -> None:
        path = self._status_path(f)
        status = {"Schedule": resolve_setting(f.schedule), "Last": last.isoformat() if last else None,
                  "Next": nxt.isoformat(), "LastUpdated": datetime.now(UTC).isoformat()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(status))
            tmp.replace(path)  # whole or not at all: a host killed mid-write leaves the last status
        except OSError as exc:  # the schedule goes on; only a restart's past-due check is lost
            log.error("timer %s: could not record its schedule status in %s: %s", f.name, path, exc)

    def _fire(self, f: FunctionInfo, past_due: bool) -> None:
        try:
            self.run_timer(f.name, past_due)
        except Exception as exc:  # the schedule goes on
            if not getattr(exc, "_devhost_logged", False):
                log.error("timer %s: could not fire: %s: %s", f.name, type(exc).__name__, exc)
