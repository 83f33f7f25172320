"""Running one queue-triggered step: parse the message with the step's model (shared.steps),
build the invocation context
(shared/context.py), log with context, call the step's handler with it (named by its queue trigger in functions/) within the step
budget (shared/budget.py: its cloud waits end well before functionTimeout), record failures.

A failure is recorded on the run (so admins see it next to the poison message) and
re-raised, so the host retries it and, after maxDequeueCount, moves it to poison.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from shared.budget import step_budget_s, within
from shared.clock import now
from shared.context import Context, invocation
from shared.errors import NotFound
from shared.log import get_logger, log_context, redact_text
from shared.models import RunEvent
from shared.steps import Step


def run_step(step: Step, body: bytes | str, handler: Callable[[Context, Any], object]) -> None:
    spec = step.spec
    ctx = invocation()
    log = get_logger()
    try:
        msg = spec.message.model_validate(json.loads(body))
    except (ValueError, ValidationError) as exc:
        log.error("unreadable message", extra={"step": step.value, "error": str(exc)[:500]})
        raise
    run_id = str(getattr(msg, "run_id", ""))
    org = str(getattr(msg, "org", ""))
    with log_context(step=step.value, run_id=run_id, org=org), within(step_budget_s()):
        try:
            handler(ctx, msg)
        except NotFound:
            log.info("the run no longer exists; nothing to do")
        except Exception as exc:
            log.exception("step failed")
            if run_id:
                _record(ctx, run_id, f"{step.value} failed: {type(exc).__name__}: {redact_text(str(exc))[:1000]}")
            raise


def _record(ctx: Context, run_id: str, message: str) -> None:
    try:
        ctx.store.events.add(run_id, RunEvent(at=now(), kind="step-error", message=message))
    except Exception:
        get_logger().exception("could not record the step error")
