"""Structured logs on the standard library's logging, arranged the way the Functions Python worker reads them.

In Azure the worker puts its own handler on the root logger (level INFO) before it imports the app and
sends each record that reaches it to the host, with its level and the invocation's id; the host writes
it to Application Insights. So the app's logger ("tensorant") propagates to the root, and every record
carries step, run_id, org and invocation_id as attributes, which the OpenTelemetry export
(PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY) stores as customDimensions. Where no root handler is
installed (make run's dev host, a script), one JSON line per record goes to stdout instead.
(Powertools' Logger, used before, adds SuppressFilter("tensorant") to every root handler, the worker's
included: not one of the app's records reached the worker's channel.)

Secrets are redacted twice: by key name in structured fields, and by value for every
secret the process has handled (registered when a connection is unsealed or a token
is minted), so a secret pasted into an error message is masked too; the value's common
encodings (reversed, base64, hex, percent-encoded) are masked as well.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from shared import metrics

# The secrets to mask (each with its common encodings: shared/log.py _encodings), most recently registered
# last. Bounded: run tokens, presigned URLs and bootstrap blobs are registered per run (a soak grew by them with
# every run), and a connection's keys are registered again each time it is unsealed, so the ones in use stay in.
MAX_SECRET_VALUES = 5 * 1024  # entries: about 1,024 secrets with their encodings
_SECRET_VALUES: OrderedDict[str, None] = OrderedDict()
_SECRETS_LOCK = threading.Lock()
_LONGEST_FIRST: list[str] = []  # _SECRET_VALUES, longest first (rebuilt when one is added)
_SECRET_KEYS = re.compile(r"(secret|password|token|api_?key|access_?key|authorization|sealed|credential)", re.I)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._\-]+")
MASK = "***"


def _encodings(value: str) -> set[str]:
    """The forms a secret is commonly printed in besides itself (a trainer printing the org's Hugging Face
    token reversed or base64 passed the exact match): reversed, base64 (standard and URL-safe, padding
    dropped), hex (either case) and percent-encoded."""
    import base64
    from urllib.parse import quote

    raw = value.encode()
    forms = {value[::-1], base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("="),
             raw.hex(), raw.hex().upper(), quote(value, safe="")}
    return {form for form in forms if len(form) >= 6}


def register_secret(value: str | None) -> None:
    global _LONGEST_FIRST
    if value and len(value) >= 6:
        with _SECRETS_LOCK:
            added = False
            for v in (value, *_encodings(value)):
                added = added or v not in _SECRET_VALUES
                _SECRET_VALUES.pop(v, None)
                _SECRET_VALUES[v] = None
            while len(_SECRET_VALUES) > MAX_SECRET_VALUES:
                _SECRET_VALUES.popitem(last=False)
                added = True
            if added:
                _LONGEST_FIRST = sorted(_SECRET_VALUES, key=len, reverse=True)


def redact_text(text: str) -> str:
    # Longest first: a secret that contains another (or another's encoding) is masked whole.
    for value in _LONGEST_FIRST:
        if value in text:
            text = text.replace(value, MASK)
    return _BEARER.sub(r"\1" + MASK, text)


def redact(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: (MASK if _SECRET_KEYS.search(str(k)) and v not in (None, "", False, True) else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_text(record.msg)
        if isinstance(record.msg, dict):
            record.msg = redact(record.msg)
        if record.args:
            record.args = tuple(redact(a) if isinstance(a, (str, dict, list)) else a for a in record.args)
        for key, value in list(record.__dict__.items()):
            if key not in _STD_ATTRS:
                record.__dict__[key] = MASK if _SECRET_KEYS.search(key) and value else redact(value)
        return True


_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

SERVICE = "tensorant"
CONTEXT_KEYS = ("step", "run_id", "org", "invocation_id")
# The Azure SDK logs every HTTP request at INFO, and the worker's root level is INFO: each Table or
# Queue call would be a trace in Application Insights.
SDK_HTTP_LOGGER = "azure.core.pipeline.policies.http_logging_policy"
# One value per thread (the worker runs each synchronous invocation on a pool thread) and per task.
_context: ContextVar[dict[str, str] | None] = ContextVar("tensorant_log_context", default=None)
_logger: logging.Logger | None = None


def _worker_invocation_id() -> str:
    """The invocation the Python worker is running on this thread (it keeps the id itself: a thread-local
    read by its dispatcher's get_current_invocation_id; `proxy_worker` is its 3.13+ name)."""
    for name in ("azure_functions_worker.dispatcher", "proxy_worker.dispatcher"):
        getter = getattr(sys.modules.get(name), "get_current_invocation_id", None)
        if getter is not None:
            try:
                return str(getter() or "")
            except Exception:
                return ""
    return ""


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        context = _context.get() or {}
        for key in CONTEXT_KEYS:
            if not getattr(record, key, None):
                setattr(record, key, context.get(key) or "-")
        if record.invocation_id == "-":  # type: ignore[attr-defined]
            record.invocation_id = _worker_invocation_id() or "-"
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "level": record.levelname, "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "service": SERVICE, "message": record.getMessage()}
        line.update({k: v for k, v in record.__dict__.items() if k not in _STD_ATTRS})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _StdoutWhenNoRootHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Prints only while the root logger has no handler: where one exists (the worker's, pytest's) the
    record reaches it by propagation, and printing too would log every line twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def configure() -> logging.Logger:
    """The app's logger; idempotent. Also quiets the Azure SDK's per-request logs to WARNING."""
    global _logger
    if _logger is None:
        logger = logging.getLogger(SERVICE)
        logger.setLevel(logging.INFO)
        logger.propagate = True
        # Logger filters run before any handler sees the record, the root's included: context, then
        # redaction (of the context too).
        logger.addFilter(_ContextFilter())
        logger.addFilter(_RedactFilter())
        handler = _StdoutWhenNoRootHandler(sys.stdout)
        handler.setFormatter(_JsonFormatter())
        logger.addHandler(handler)
        logging.getLogger(SDK_HTTP_LOGGER).setLevel(logging.WARNING)
        _logger = logger
    return _logger


def get_logger() -> logging.Logger:
    return _logger or configure()


@contextmanager
def log_context(*, step: str, run_id: str = "", org: str = "", invocation_id: str = "") -> Iterator[logging.Logger]:
    """Every line inside carries step, run_id, org and the invocation's id; the time spent inside is the
    step's duration metric (every queue step and timer runs in one)."""
    values = {"step": step, "run_id": run_id, "org": org, "invocation_id": invocation_id}
    token = _context.set({**(_context.get() or {}), **{k: v for k, v in values.items() if v}})
    started, outcome = time.perf_counter(), "failed"
    try:
        yield get_logger()
        outcome = "done"
    finally:
        _context.reset(token)
        metrics.seconds(metrics.STEP_DURATION, time.perf_counter() - started, step=step, outcome=outcome)
