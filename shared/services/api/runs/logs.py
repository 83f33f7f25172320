"""A run's training log lines, a page at a time, and the loss curve read from them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from shared.context import Context
from shared.errors import InvalidInput
from shared.lifecycle import TERMINAL
from shared.security import Principal
from shared.services.api import quotas

LOG_PAGE_DEFAULT = 1000


LOG_PAGE_MAX = 5000


class MetricPoint(BaseModel):
    """One training step's loss (and learning rate), from the trainer's `progress=` line."""

    step: int = Field(ge=0)
    loss: float
    lr: float | None = None


class EvalPoint(BaseModel):
    """One evaluation during training (`eval_every_steps`) on the held-out split. A DPO run's
    (training.method dpo) carries its preference accuracy and reward margin; an SFT run's has neither key."""

    step: int = Field(ge=0)
    eval_loss: float
    preference_accuracy: float | None = Field(default=None, ge=0, le=1, description=(
        "share of held-out pairs whose chosen answer the adapter prefers over the rejected one more than the "
        "base model does (method dpo)"))
    reward_margin: float | None = Field(default=None, description=(
        "mean over held-out pairs of the chosen answer's reward minus the rejected one's (method dpo)"))


class RunMetrics(BaseModel):
    """The run's curves for a chart: the training loss per step and the evaluations per evaluated step."""

    points: list[MetricPoint]
    eval_points: list[EvalPoint] = Field(description="the eval curve beside the loss: one point per evaluation, "
                                                      "by step (a DPO run's with its preference accuracy and margin)")
    eval_loss: float | None = Field(description="the last eval loss reported (during or after training)")
    truncated: bool = Field(description="lines before from_line were not read (a long log: pass after=0 and "
                                        "follow next for all of it)")
    from_line: int = Field(ge=0)
    next: str | None = Field(description="the cursor for the lines after these; null once the run ended and "
                                          "every line was read")


def logs(ctx: Context, principal: Principal, run_id: str, after: str | None = None, limit: str | None = None) -> dict[str, Any]:
    """One page of the run's log lines after the cursor (a line number; none = from the start).

    `next` is the cursor for the following lines; null once the run is terminal and every
    stored line was returned (while it runs, polling with `next` picks up new lines)."""
    run, _ = ctx.store.runs.get(principal.org, run_id)
    if after is None or after == "":
        start = 0
    elif after.isascii() and after.isdigit() and len(after) <= 10:
        start = int(after)
    else:
        raise InvalidInput.field("after", "a cursor from a previous page's `next`")
    if limit is None or limit == "":
        count = LOG_PAGE_DEFAULT
    elif limit.isascii() and limit.isdigit() and len(limit) <= 4 and 1 <= int(limit) <= LOG_PAGE_MAX:
        count = int(limit)
    else:
        raise InvalidInput.field("limit", f"a whole number from 1 to {LOG_PAGE_MAX}")
    lines, cursor = ctx.store.logs.read(run.id, start, count)
    done = len(lines) < count and run.state in TERMINAL
    return {"lines": lines, "next": None if done else str(cursor), "state": run.state.value}


# /metrics reads at most this many log lines a call (so at most as many points): the newest by default,
# or a page from a line cursor (`after`, with `next` to follow), so a long run stays cheap to plot. The
# whole log (20,000 lines of up to 2,000 characters) was read and parsed on every call: 40 MB.
METRIC_LINES = 2000




def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def parse_metric_line(line: str) -> dict[str, Any] | None:
    """A trainer line `progress=.. step=<n> loss=<x> [lr=<y>]` as a point, else None."""
    text = line.strip()
    if not text.startswith("progress="):
        return None
    pairs = dict(p.split("=", 1) for p in text.split() if "=" in p)
    try:
        step = int(pairs.get("step", ""))
    except ValueError:
        return None
    loss = _number(pairs.get("loss", ""))
    if loss is None:
        return None
    lr = _number(pairs["lr"]) if "lr" in pairs else None
    return {"step": step, "loss": loss, "lr": lr}


def parse_eval_line(line: str) -> dict[str, Any] | None:
    """A trainer line `eval step=<n> eval_loss=<x>` (an evaluation during training; a DPO run's adds
    `preference_accuracy=<a> reward_margin=<m>`) as a point, else None."""
    text = line.strip()
    if not text.startswith("eval step="):
        return None
    pairs = dict(p.split("=", 1) for p in text.split() if "=" in p)
    loss = _number(pairs.get("eval_loss", ""))
    step = pairs.get("step", "")
    if loss is None or not (step.isascii() and step.isdigit() and len(step) <= 9):
        return None
    point: dict[str, Any] = {"step": int(step), "eval_loss": loss}
    # method dpo: the held-out preference accuracy (0..1) and reward margin, on the same line
    for name in ("preference_accuracy", "reward_margin"):
        value = _number(pairs.get(name, ""))
        if value is not None and (name != "preference_accuracy" or 0.0 <= value <= 1.0):
            point[name] = value
    return point


def _eval_loss(line: str) -> float | None:
    # lora.py prints "trainer: eval_loss after training = 1.2345"; accept eval_loss=<x> too.
    text = line.strip()
    if "eval_loss after training" in text:
        return _number(text.rsplit("=", 1)[-1].strip())
    for part in text.split():
        if part.startswith("eval_loss="):
            return _number(part.removeprefix("eval_loss="))
    return None


def metrics(ctx: Context, principal: Principal, run_id: str, after: str | None = None) -> dict[str, Any]:
    """Per-step loss from the trainer's progress lines in the run's stored logs: of its newest METRIC_LINES
    lines, or of the METRIC_LINES after the line cursor `after` (`next` follows; null at the end of a
    run that ended). Rate-limited per org (quotas.take_read)."""
    run, _ = ctx.store.runs.get(principal.org, run_id)
    if after is None or after == "":
        start = max(0, run.log_lines - METRIC_LINES)
    elif after.isascii() and after.isdigit() and len(after) <= 10:
        start = int(after)
    else:
        raise InvalidInput.field("after", "a cursor from a previous answer's `next`")
    quotas.take_read(ctx, principal, "metrics")
    points: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, Any]] = {}  # the eval curve beside the loss (eval_every_steps)
    eval_loss: float | None = None
    lines, cursor = ctx.store.logs.read(run_id, start, METRIC_LINES)
    for line in lines:
        point = parse_metric_line(line)
        if point is not None:
            points[point["step"]] = point  # a step repeated (a restarted agent) keeps its last value
        elif (evaluated := parse_eval_line(line)) is not None:
            evals[evaluated["step"]] = evaluated
            eval_loss = evaluated["eval_loss"]
        elif "eval_loss" in line and (value := _eval_loss(line)) is not None:
            eval_loss = value
    ordered = [points[k] for k in sorted(points)]
    done = len(lines) < METRIC_LINES and run.state in TERMINAL
    return {"points": ordered, "eval_points": [evals[k] for k in sorted(evals)], "eval_loss": eval_loss,
            "truncated": start > 0, "from_line": start,
            "next": None if done else str(cursor)}
