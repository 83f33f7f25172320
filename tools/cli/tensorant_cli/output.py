"""How every command prints: text lines made printable, `--json`, `-q` ids, and tables."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from tensorant_cli.render import printable


def say(text: Any = "", file: TextIO | None = None) -> None:
    """print for every line of text output: most of it came from a run or a cloud (log lines,
    reasons, events, check messages), and an escape sequence in it would drive the user's terminal
    (retitle it, clear it, overwrite a line with a fake "succeeded"); control characters show as \\xNN."""
    print(printable(text), file=file)


def out(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))  # JSON escapes control characters itself


def emit(args: argparse.Namespace, value: Any, text: Any, ids: Any = None) -> None:
    """Print `value` as JSON (--json), its ids (-q), or the human text (a callable or a string)."""
    if getattr(args, "json", False):
        out(value)
    elif getattr(args, "quiet", False):
        for i in (ids if ids is not None else _ids(value)):
            say(i)
    elif callable(text):
        text()
    else:
        say(text)


def _ids(value: Any) -> list[str]:
    if isinstance(value, dict) and "id" in value:
        return [str(value["id"])]
    return [str(r.get("id") or r.get("offer_id")) for r in items(value) if isinstance(r, dict)]


def items(value: Any, *keys: str) -> list[dict[str, Any]]:
    """The list in an API answer: the answer itself, or its first list under `keys`, then `items`."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        for key in (*keys, "items"):
            if isinstance(value.get(key), list):
                return list(value[key])
    return []


def table(rows: list[dict[str, Any]], columns: list[str], empty: str = "(none)",
          headers: dict[str, str] | None = None) -> None:
    if not rows:
        say(empty)
        return
    names = [(headers or {}).get(c, c) for c in columns]
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(n), *(len(row[i]) for row in cells)) for i, n in enumerate(names)]
    say("  ".join(n.upper().ljust(w) for n, w in zip(names, widths, strict=True)).rstrip())
    for row in cells:
        say("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict | list):
        return json.dumps(v, default=str)
    return printable(v)  # before padding: an escaped character is as wide as it prints


def short(text: Any, width: int = 60) -> str:
    s = str(text or "")
    return s if len(s) <= width else s[: width - 1] + "…"
