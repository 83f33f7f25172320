"""How long one invocation may spend waiting on a cloud, so that none comes near functionTimeout.

The Functions host kills an invocation at functionTimeout (host.json: 5 min) and restarts the whole
language worker with it (docs/LESSONS: every other invocation on that worker dies too); the front
end cuts an HTTP request at about 230 s whatever the setting. So no invocation waits that long:
- a whole invocation stays under a third of functionTimeout (`invocation_bound_s`, 100 s);
- of that, `step_budget_s` (the third less MARGIN_S for the store reads and writes around the
  cloud calls, 80 s) is what its cloud waits may use: long-running operations and inline
  throttling retries. `run_step` opens it (`within`) around every queue step; providers ask
  `remaining(cap)` before each wait and report "not done yet" (CloudProgress(done=False), or a
  RetryableError) instead of waiting past it, and the step sends itself a delayed message;
- no single long-running operation is waited on for more than LRO_WAIT_S (20 s), budget or not
  (an HTTP route that starts a machine, or code outside any invocation, gets that cap alone).

functionTimeout is read as the host reads it: the app setting `AzureFunctionsJobHost__functionTimeout`
overrides host.json's value; DEFAULT_FUNCTION_TIMEOUT_S (Consumption's default) if neither says.
Time is the core's clock (shared/clock.py), so tests measure it on their simulated clock.

`BOUNDS` declares, for every function the app registers, the longest an invocation of it may take;
tests/test_budget.py fails for a function that is not in it (a new route or step must say how it
stays bounded) and measures the flows that reach a slow cloud against it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from shared.clock import now_ts

DEFAULT_FUNCTION_TIMEOUT_S = 300.0
HTTP_CUT_S = 230.0  # the front end's cut of an HTTP request, whatever functionTimeout says
MARGIN_S = 20.0
LRO_WAIT_S = 20.0
TIMEOUT_SETTING = "AzureFunctionsJobHost__functionTimeout"
# The code of a RetryableError that is no failure: the cloud is still working on what it was asked
# (a provider that would have to wait past the budget raises it); the step asks again after
# retry_after_s, within the run's deadlines.
IN_PROGRESS = "InProgress"
HOST_JSON = Path(__file__).resolve().parents[1] / "host.json"


def _seconds(value: str) -> float:
    """A host.json timespan ("00:05:00", "1.00:00:00") in seconds; "-1" (no limit) is infinite."""
    value = value.strip()
    if value == "-1":
        return math.inf
    m = re.fullmatch(r"(?:(\d+)\.)?(\d+):(\d+):(\d+(?:\.\d+)?)", value)
    if not m:
        raise ValueError(f"functionTimeout {value!r} is not a timespan like 00:05:00")
    days, hours, minutes, seconds = m.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


@cache
def _host_json_timeout() -> str | None:
    try:
        return json.loads(HOST_JSON.read_text()).get("functionTimeout")
    except (OSError, ValueError):
        return None


def function_timeout_s() -> float:
    """The host's functionTimeout in seconds: the app setting, else host.json, else 300 s."""
    value = os.environ.get(TIMEOUT_SETTING) or _host_json_timeout()
    return _seconds(value) if value else DEFAULT_FUNCTION_TIMEOUT_S


def invocation_bound_s() -> float:
    """The longest one queue or timer invocation may take: a third of functionTimeout (a plan
    without a limit is held to the Consumption default's third all the same)."""
    timeout = function_timeout_s()
    return (timeout if math.isfinite(timeout) else DEFAULT_FUNCTION_TIMEOUT_S) / 3


def step_budget_s() -> float:
    """What one step's cloud waits (long-running operations, throttling retries) may use."""
    return invocation_bound_s() - MARGIN_S


def http_bound_s() -> float:
    """The longest an HTTP invocation may take: the lesser of the front end's cut and the step bound."""
    return min(HTTP_CUT_S, invocation_bound_s())


# ------------------------------------------------------------ the current invocation's deadline


@dataclass(frozen=True)
class Deadline:
    at: float  # a shared.clock timestamp

    def remaining(self) -> float:
        return max(0.0, self.at - now_ts())


_current: ContextVar[Deadline | None] = ContextVar("tensorant_deadline", default=None)


@contextmanager
def within(seconds: float) -> Iterator[Deadline]:
    """Bound the cloud waits of what runs inside to `seconds` from now (an outer, earlier deadline
    still wins)."""
    outer = _current.get()
    deadline = Deadline(now_ts() + seconds)
    if outer is not None and outer.at < deadline.at:
        deadline = outer
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)


def remaining(cap: float = math.inf) -> float:
    """How long a wait may last now: `cap`, or less where the current invocation's budget ends first."""
    deadline = _current.get()
    return max(0.0, min(cap, deadline.remaining() if deadline is not None else cap))


def allows(seconds: float) -> bool:
    """Whether a wait of `seconds` (an inline retry's sleep) still fits in the current budget."""
    return seconds <= remaining()


# ------------------------------------------------------------ every function's declared bound

STEP = "step"  # run through shared.services.steps.runner.run_step, which opens step_budget_s
TIMER = "timer"  # a timer: its own work bounded (the sweeper hands each account to sweep-account)
HTTP = "http"  # reads and writes the store, enqueues; no cloud call
HTTP_CLOUD = "http-cloud"  # calls a cloud inline: each wait capped at LRO_WAIT_S, throttling bounded

# Every function the app registers, by function name. A new one must be added here with how it
# stays bounded: tests/test_budget.py fails otherwise. A route that would wait on a cloud longer
# than http_bound_s() must instead enqueue a step (202 Accepted) and let the step wait with delayed
# messages.
BOUNDS: dict[str, str] = {
    # steps (shared/steps.py)
    "validate_connection": STEP, "refresh_catalog": STEP, "launch": STEP, "verify_adapter": STEP,
    "retain": STEP, "release": STEP, "sweep_account": STEP, "stop_idle": STEP, "deliver_webhook": STEP,
    # timers
    "refresh_catalog_timer": TIMER, "heartbeat_check": TIMER, "sweeper": TIMER,
    "prune_history": TIMER,  # at most PER_TICK runs, within its own BUDGET_S
    # routes that reach a cloud inline
    "recover_run": HTTP_CLOUD,  # recover: provider.start of the retained machine
    "stop_run": HTTP_CLOUD,  # provider.retain of a machine started for recovery
    "runpod_volumes": HTTP_CLOUD,  # one RunPod GraphQL read
    "save_compute": HTTP_CLOUD, "check_compute": HTTP_CLOUD,  # scope read; the checks run in a step
    "save_named_compute": HTTP_CLOUD, "check_named_compute": HTTP_CLOUD,  # the same, for a named connection
    # a base model named by Hub id: its config.json read inline, once, within hub_models.HUB_READ_S
    "create_run": HTTP_CLOUD, "patch_run": HTTP_CLOUD, "forecast_run": HTTP_CLOUD,
    # a webhook's URL resolved by the endpoint guard (DNS), bounded by its resolver's timeout
    "create_webhook": HTTP_CLOUD, "patch_webhook": HTTP_CLOUD,
    # routes on the store and storage only
    **dict.fromkeys([
        "get_compute", "delete_compute", "get_named_compute", "delete_named_compute",
        "save_storage", "get_storage", "list_connections", "gpus",
        "create_project", "list_projects", "upload_dataset", "dataset_upload_url", "commit_dataset",
        "list_datasets", "list_runs", "get_run", "delete_run", "run_metrics",
        "run_logs", "launch_run", "cancel_run", "release_run", "run_adapter", "get_usage", "get_limits",
        "put_limits", "heartbeat", "complete", "boot_failed", "bootstrap", "restart", "queues", "poison", "replay", "discard",
        "sweep", "sweep_report",  # an admin sweep is enqueued (202), one account per sweep-account message
        "list_base_models", "list_org_secrets", "put_hf_token", "delete_hf_token", "openapi", "docs",
        "docs_asset", "run_checkpoints", "put_mlflow", "delete_mlflow", "put_wandb", "delete_wandb",
        "get_webhook", "list_webhooks", "delete_webhook", "rotate_webhook", "webhook_deliveries",
        "test_webhook",  # a webhook.test delivery is enqueued
        "console", "console_file"],  # the web console's static files (functions/console.py)
        HTTP),
}


def bound_s(kind: str) -> float:
    """The longest an invocation of a function of this kind may take."""
    return http_bound_s() if kind in (HTTP, HTTP_CLOUD) else invocation_bound_s()
