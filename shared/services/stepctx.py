"""Running one queue-triggered step: parse the message, log with context, record failures.

A failure is recorded on the run (so admins see it next to the poison message) and
re-raised, so the host retries it and, after maxDequeueCount, moves it to poison.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from shared.clock import now
from shared.errors import NotFound
from shared.log import get_logger, log_context, redact_text
from shared.models import RunEvent

M = TypeVar("M", bound=BaseModel)


def run_step(step: str, body: bytes | str, model: type[M], handle: Callable[[M], object]) -> None:
    log = get_logger()
    try:
        msg = model.model_validate(json.loads(body))
    except (ValueError, ValidationError) as exc:
        log.error("unreadable message", extra={"step": step, "error": str(exc)[:500]})
        raise
    run_id = str(getattr(msg, "run_id", ""))
    org = str(getattr(msg, "org", ""))
    with log_context(step=step, run_id=run_id, org=org):
        try:
            handle(msg)
        except NotFound:
            log.info("the run no longer exists; nothing to do")
        except Exception as exc:
            log.exception("step failed")
            if run_id:
                _record(run_id, f"{step} failed: {type(exc).__name__}: {redact_text(str(exc))[:1000]}")
            raise


def _record(run_id: str, message: str) -> None:
    from shared.store import get_store

    try:
        get_store().add_event(run_id, RunEvent(at=now(), kind="step-error", message=message))
    except Exception:
        get_logger().exception("could not record the step error")
