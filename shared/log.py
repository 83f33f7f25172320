"""Structured JSON logging (Powertools Logger) with run id, org and step on every line.

Secrets are redacted twice: by key name in structured fields, and by value for every
secret the process has handled (registered when a connection is unsealed or a token
is minted), so a secret pasted into an error message is masked too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_SECRET_VALUES: set[str] = set()
_SECRET_KEYS = re.compile(r"(secret|password|token|api_?key|access_?key|authorization|sealed|credential)", re.I)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._\-]+")
MASK = "***"


def register_secret(value: str | None) -> None:
    if value and len(value) >= 6:
        _SECRET_VALUES.add(value)


def redact_text(text: str) -> str:
    for value in _SECRET_VALUES:
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

_logger: Any = None


def get_logger() -> Any:
    global _logger
    if _logger is None:
        from aws_lambda_powertools import Logger

        _logger = Logger(service="tensorant", use_rfc3339=True)
        _logger.addFilter(_RedactFilter())
        for handler in _logger.handlers:
            handler.addFilter(_RedactFilter())
    return _logger


@contextmanager
def log_context(*, step: str, run_id: str = "", org: str = "") -> Iterator[Any]:
    """Every line inside carries step, run_id and org."""
    log = get_logger()
    # Thread-local keys: the host runs several invocations at once in one process.
    log.thread_safe_append_keys(step=step, run_id=run_id or "-", org=org or "-")
    try:
        yield log
    finally:
        log.thread_safe_remove_keys(["step", "run_id", "org"])
