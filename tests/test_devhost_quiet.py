"""The dev host's idle terminal (issue 31): housekeeping ticks are quiet, their warnings are not."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.azurite import Azurite


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_idle_timer_tick_prints_nothing_but_its_warnings(azurite: Azurite, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """heartbeat-check printed three lines a minute (Executing, its JSON stats line, Executed) and the
    sweeper three more every five: the real warnings scrolled away."""
    import azure.functions as func

    from tensorant_devhost import Host
    from tensorant_devhost.logger import log as devhost_log

    monkeypatch.setenv("AzureWebJobsStorage", azurite.connection_string)
    (tmp_path / "host.json").write_text(json.dumps({"version": "2.0"}))
    app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)
    app_log = logging.getLogger("tensorant")

    @app.timer_trigger(arg_name="timer", schedule="0 0 0 1 1 *", run_on_startup=False)
    def tick(timer: func.TimerRequest) -> None:
        app_log.info("heartbeat check", extra={"watched": 0})
        app_log.warning("a run's agent went silent")

    shown, seen = _Records(), _Records()
    devhost_log.addHandler(shown)
    app_log.addHandler(seen)
    level = app_log.level
    app_log.setLevel(logging.INFO)
    try:
        with Host(app, root=tmp_path, http=False, queues=False, timers=False) as host:
            host.run_timer("tick")
            assert [r.getMessage() for r in seen.records] == ["a run's agent went silent"]
            assert not [r.getMessage() for r in shown.records if "Functions.tick" in r.getMessage()]
            # Every line asked for (make run --verbose): the tick's info line shows too.
            devhost_log.setLevel(logging.DEBUG)
            host.run_timer("tick")
            assert [r.getMessage() for r in seen.records][-2:] == ["heartbeat check", "a run's agent went silent"]
            assert any("Executed 'Functions.tick'" in r.getMessage() for r in shown.records)
        # Outside a housekeeping invocation the app's info lines are untouched.
        devhost_log.setLevel(logging.INFO)
        app_log.info("a step's line")
        assert seen.records[-1].getMessage() == "a step's line"
    finally:
        devhost_log.removeHandler(shown)
        app_log.removeHandler(seen)
        app_log.setLevel(level)
        devhost_log.setLevel(logging.INFO)
