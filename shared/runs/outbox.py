"""Webhook deliveries derived from what happens to runs, crash-safe through the run's outbox.

A run's outside event (shared/outside_events.py: a transition into queued, training, succeeded,
failed, cancelled or retained, or an event recorded with a `type`) is written as a Notice into the run's
record in the SAME write as the change it tells of (moves.move_stored; with_notice for the callers that
decide a warning in their own write). After that write, drain() queues one deliver-webhook message per
subscribed endpoint and removes the notices from the record. A crash in between leaves the notice on the
record, and the record stays in the watch index while it holds notices (store.runs.mutate), so
heartbeat-check drains it within a minute or two (drain_stale). A notice drained twice (a crash after the
send, before the removal) is queued again under the same webhook-id; the deliver step sends an event an
endpoint has accepted once only, and a receiver deduplicates by webhook-id anyway.

Events of no run (budget.threshold, connection.check_failed) are queued directly (send_event) with an id
derived from what they tell of, so the caller may send them again after a crash without a new id.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime
from typing import Any

from shared.clock import now
from shared.context import Context
from shared.log import get_logger
from shared.models import Notice, RunRecord
from shared.runs.costs import timing
from shared.steps import Step
from shared.webhooks import store
from shared.webhooks.models import DeliveryMessage

# A record holds at most this many undelivered notices (a run changes state a dozen times at most; more
# means the queue is unreachable for long): the oldest give way.
MAX_NOTICES = 20
# heartbeat-check drains a run's notices once they are this old (the writer had time to drain them itself).
STALE_AFTER_S = 60


def new_webhook_id() -> str:
    return "msg_" + secrets.token_urlsafe(18)


def with_notice(run: RunRecord, type_: str, reason: str = "") -> RunRecord:
    """`run` with one more notice, for a write that decides an outside event."""
    n = Notice(id=new_webhook_id(), type=type_, at=now(), state=run.state.value, reason=reason[:2000])
    return run.model_copy(update={"notices": [*run.notices, n][-MAX_NOTICES:]})


def run_body(ctx: Context, run: RunRecord, n: Notice) -> str:
    """The JSON body: type, timestamp and the run's ids, state, reason and cost so far; never a secret,
    a URL or a log line."""
    try:
        cost = timing(ctx, run).cost
    except Exception:  # a record too old to price without its events: the body says so rather than fail
        cost = None
    data: dict[str, Any] = {"run_id": run.id, "org": run.org, "project_id": run.project_id, "state": n.state,
                            "reason": n.reason, "cost": cost, "currency": run.offer.currency,
                            "provider": run.provider}
    return json.dumps({"type": n.type, "timestamp": n.at.isoformat(), "data": data}, separators=(",", ":"))


def _queue(ctx: Context, org: str, type_: str, webhook_id: str, body: str, subject: str = "") -> int:
    sent = 0
    for ep in store.endpoints(ctx, org):
        if ep.enabled and type_ in ep.types:
            ctx.queues.send(Step.deliver_webhook, DeliveryMessage(
                org=org, endpoint_id=ep.id, webhook_id=webhook_id, type=type_, body=body, subject=subject))
            sent += 1
    return sent


def drain(ctx: Context, run: RunRecord) -> RunRecord:
    """Queue the deliveries of the run's notices, then remove them from its record; returns the run as
    stored after. Never raises: what could not be queued stays for heartbeat-check."""
    if not run.notices:
        return run

    try:
        for n in run.notices:
            _queue(ctx, run.org, n.type, n.id, run_body(ctx, run, n), run.id)
        done = {n.id for n in run.notices}

        def change(r: RunRecord) -> RunRecord | None:
            keep = [n for n in r.notices if n.id not in done]
            return None if len(keep) == len(r.notices) else r.model_copy(update={"notices": keep})

        return ctx.store.runs.mutate(run.org, run.id, change)[0]
    except Exception:
        get_logger().exception("webhook notices not queued yet; heartbeat-check queues them",
                               extra={"run_id": run.id})
        return run


def notify(ctx: Context, run: RunRecord, type_: str, reason: str) -> None:
    """An event with an outside type (shared.runs.events.event): its notice, unless the write that decided
    it holds one already (with_notice), then the drain."""
    if not any(n.type == type_ and n.reason == reason[:2000] for n in run.notices):
        try:
            run, _ = ctx.store.runs.mutate(run.org, run.id, lambda r: with_notice(r, type_, reason))
        except Exception:
            get_logger().exception("webhook notice not recorded", extra={"run_id": run.id})
            return
    drain(ctx, run)


def drain_stale(ctx: Context, runs: list[RunRecord], t: datetime) -> int:
    """heartbeat-check: drain the notices a crash left on records (older than STALE_AFTER_S)."""
    n = 0
    for run in runs:
        if run.notices and min((t - x.at).total_seconds() for x in run.notices) >= STALE_AFTER_S:
            drain(ctx, run)
            n += 1
    return n


def send_event(ctx: Context, org: str, type_: str, webhook_id: str, data: dict[str, Any]) -> int:
    """An outside event of no run, queued for the org's endpoints now under `webhook_id` (derived by the
    caller from what it tells of). Returns the deliveries queued; never raises."""
    body = json.dumps({"type": type_, "timestamp": now().isoformat(), "data": {"org": org, **data}},
                      separators=(",", ":"))
    try:
        return _queue(ctx, org, type_, webhook_id, body)
    except Exception:
        get_logger().exception("webhook event not queued", extra={"org": org, "type": type_})
        return 0
