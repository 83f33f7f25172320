"""Text that came from a run (log lines, reasons, events) cannot drive the user's
terminal: the CLI prints its control characters as \\xNN."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest

from tensorant_cli import main as cli
from tensorant_cli.client import ApiError
from tensorant_cli.commands.watch import watch
from tensorant_cli.render import printable

# Retitle the terminal, clear it, return to the line start and print a fake verdict, then a C1 CSI.
EVIL = "\x1b]0;pwned\x07\x1b[2J\rrun r-1 succeeded\x9b31m\x08"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x0drun r-1 succeeded\\x9b31m\\x08"
# Any control character but newline (between printed lines) and tab.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_printable_shows_controls_and_keeps_text() -> None:
    assert printable(EVIL) == SHOWN
    assert printable("a\nb\x00\x7f") == "a\\x0ab\\x00\\x7f"
    text = "step 3\tloss 0.25 — naïve 日本語 ✓ \\x1b"  # tab, Unicode and a literal backslash stay
    assert printable(text) == text
    assert printable(printable(EVIL)) == printable(EVIL)


RUN: dict[str, Any] = {
    "id": "r-1", "state": "failed", "phase": "failed", "progress": 0.5, "kind": "trial", "base_model": "m",
    "provider": "local", "reason": EVIL, "billing_note": EVIL, "release_error": EVIL, "warnings": [EVIL],
    "offer": {"gpu": EVIL, "machine_type": "m", "region": "r", "currency": "USD", "total_per_hour": 1.0},
    "resources": [{"kind": "vm", "id": EVIL, "state": "gone"}],
    "events": [{"at": "2026-01-01T00:00:00Z", "kind": "transition", "message": f"running -> failed {EVIL}"},
               {"at": "2026-01-01T00:00:01Z", "kind": "warning", "message": EVIL}],
}
LINES = [f"trainer says {EVIL}", "step 1\tloss 0.5 ✓"]


class FakeClient:
    """The API's answers for one failed run whose every text field carries escape sequences."""

    def __init__(self, url: str = "", token: str | None = None) -> None:
        self.url, self.token = url, token

    def get(self, path: str, **params: str) -> Any:
        return {"/api/runs": {"runs": [RUN]}, "/api/runs/r-1": RUN, "/api/runs/r-1/logs": {"lines": LINES},
                "/api/runs/r-1/metrics": {"points": []}}[path]

    def post(self, path: str, body: Any = None) -> Any:
        if path.endswith("/release"):
            raise ApiError(409, "conflict", f"the run is failed: {EVIL}", [{"field": "id", "message": EVIL}])
        return RUN


@pytest.mark.parametrize("argv", [
    ["runs", "logs", "r-1"], ["runs", "logs", "r-1", "-f", "--interval", "0"], ["runs", "get", "r-1"],
    ["runs", "list"], ["runs", "stop", "r-1"], ["runs", "release", "r-1"],
    ["runs", "watch", "r-1", "--interval", "0"],
])
def test_commands_print_run_text_visibly(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "Client", FakeClient)
    cli.main(argv)
    got = capsys.readouterr()
    for out in (got.out, got.err):
        assert not CONTROL.search(out), repr(out)
    assert "\\x1b]0;pwned\\x07" in got.out + got.err


def test_runs_list_pads_columns_by_the_printed_width(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "Client", FakeClient)
    monkeypatch.setitem(RUN, "reason", "a\x1bb")
    cli.main(["runs", "list"])
    head, row = capsys.readouterr().out.splitlines()
    assert row[head.index("REASON"):] == "a\\x1bb"


def test_watch_on_a_terminal_writes_only_its_own_escape_sequences() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Tty()
    assert watch(FakeClient(), "r-1", interval=0, stream=screen) == 1  # type: ignore[arg-type]
    text = screen.getvalue()
    assert "  | trainer says " + SHOWN in text and "warning: " + SHOWN in text
    own = re.sub(r"\x1b\[\d+F\x1b\[J", "", text)  # the redraw of the status block
    assert not CONTROL.search(own), repr(own)


def test_printable_shows_bidi_and_zero_width_characters() -> None:
    # U+202E turns the rest of the line around on the screen ("succeeded" read from "deliaf" + override), a
    # zero-width space hides inside a word, an isolate or the BOM hides nothing visible: each is shown.
    assert printable("run \u202edeliaf\u202c ok") == "run \\u202edeliaf\\u202c ok"
    assert printable("suc\u200bceeded\u200d\u2066x\u2069\ufeff\u2028") == \
        "suc\\u200bceeded\\u200d\\u2066x\\u2069\\ufeff\\u2028"
    for c in (0x061C, 0x200E, 0x200F, 0x202A, 0x202B, 0x202D, 0x2060, 0x2067, 0x2068):
        assert printable(chr(c)) == f"\\u{c:04x}"
    assert printable(printable("\u202e\u200b")) == printable("\u202e\u200b")
