"""The last lines of a machine's console, as the cloud keeps it (EC2 console output, the Azure
boot diagnostics serial log): what a provider's optional `console_output` returns for a machine
that never reported (see base.console_of).

Console text comes from the machine, so it is cleaned before anyone sees it: terminal escapes and
control characters dropped, registered secrets and bearer tokens masked (shared.log.redact_text),
and, because the process reading it may never have seen the run's secrets, anything shaped like
one masked too (a JWT, a presigned URL's query, NAME=value where the name says secret). Bounded:
the last MAX_LINES non-empty lines, at most MAX_CHARS characters.
"""

from __future__ import annotations

import re

from shared.log import MASK, redact_text

MAX_LINES = 10
MAX_CHARS = 1500
TAIL_BYTES = 8192  # read from the end of a console log: enough for MAX_LINES long lines
READ_TIMEOUT_S = 10.0
UNAVAILABLE = "console output unavailable: "

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")
_CONTROL = re.compile(r"[^\t\x20-\x7e\u00a0-\uffff]")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}")
_URL_QUERY = re.compile(r"(https?://[^\s?#]+)\?[^\s\"']+")
_ASSIGNED = re.compile(r"\b([A-Za-z0-9_.-]*(?:token|secret|password|passwd|api_?key|access_?key|credential|"
                       r"signature)[A-Za-z0-9_.-]*\s*[=:]\s*)[\"']?[^\s\"',;]+", re.I)
_BOOTSTRAP = re.compile(r"\b([A-Z0-9_]*BOOTSTRAP\s*=\s*)\S+")
_BLOB = re.compile(r"(?<![\w/+=-])[A-Za-z0-9+/_-]{64,}={0,2}")


def _blob(match: re.Match[str]) -> str:
    # Base64 of random bytes has both cases; a path (leading /) or a hex digest is kept for the reader.
    text = match.group(0)
    if text.startswith("/") or not (re.search(r"[A-Z]", text) and re.search(r"[a-z]", text)):
        return text
    return MASK


def scrub(text: str) -> str:
    """One line or many, with every secret-shaped value masked (see the module docstring)."""
    text = redact_text(text)
    text = _JWT.sub(MASK, text)
    text = _URL_QUERY.sub(lambda m: f"{m.group(1)}?{MASK}", text)
    text = _ASSIGNED.sub(lambda m: m.group(1) + MASK, text)
    text = _BOOTSTRAP.sub(lambda m: m.group(1) + MASK, text)
    return _BLOB.sub(_blob, text)


def tail_lines(text: str, *, max_lines: int = MAX_LINES, max_chars: int = MAX_CHARS) -> str:
    """The last max_lines non-empty printable lines of a console log, scrubbed, at most max_chars
    characters (the end is kept: the newest lines say the most)."""
    lines = []
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = _CONTROL.sub("", _ESCAPES.sub("", raw)).rstrip()
        if line.strip():
            lines.append(line)
    out = scrub("\n".join(lines[-max_lines:]))
    return out if len(out) <= max_chars else "…" + out[-(max_chars - 1):]


def bounded(text: str, max_chars: int = MAX_CHARS) -> str:
    """A cloud's free text (a status message, a reason) scrubbed and cut to max_chars."""
    text = scrub(text)
    return text if len(text) <= max_chars else text[:max_chars - 1] + "…"
