"""Platform admin: queue depths, poison messages (list, replay, discard), sweep on demand.

A step message that failed maxDequeueCount times sits in `<queue>-poison`. Admins see
each with its run, the run's state and the last error the step recorded, then replay it
(one by id, or all: it goes back on its queue as a fresh message and succeeds once the
fault is gone; the steps are idempotent, so a replay of a message whose run has moved on
does nothing) or discard it. Replays and discards are audit events.
"""

from __future__ import annotations

import re
from typing import Any

from shared.context import Context
from shared.errors import InvalidInput, NotFound
from shared.models import Role, RunState, SweepRequest
from shared.queues import Queue, decode
from shared.security import Principal, require
from shared.services.timers.sweeper import fan_out, report

PEEK_LIMIT = 32  # the queue service's most per peek
TAKE_VISIBILITY_S = 60  # long enough to replay or discard what was taken


def _queue(name: str) -> Queue:
    try:
        return Queue(name.removesuffix("-poison"))
    except ValueError as exc:
        known = ", ".join(q.value for q in Queue)
        raise InvalidInput.field("queue", f"unknown queue {name!r}; use one of {known}") from exc


def queues(ctx: Context, principal: Principal) -> dict[str, Any]:
    require(principal, Role.admin)
    q = ctx.queues
    return {"items": [{"name": x.value, "length": q.length(x.value), "poison_length": q.length(x.poison)}
                      for x in Queue]}


def _run_info(ctx: Context, body: dict[str, Any]) -> dict[str, str]:
    org, run_id = body.get("org"), body.get("run_id")
    if not org or not run_id:
        return {"run_state": "", "last_error": ""}
    try:
        run, _ = ctx.store.runs.get(str(org), str(run_id))
    except NotFound:
        return {"run_state": "", "last_error": "the run no longer exists"}
    errors = [e.message for e in ctx.store.events.read(run.id, kind="step-error")]
    last = errors[-1] if errors else (run.release_error if run.state == RunState.releasing else "")
    return {"run_state": run.state.value, "last_error": last}


def _item(ctx: Context, m: Any) -> dict[str, Any]:
    body = _body(m)
    return {"id": m.id, "run_id": str(body.get("run_id", "")), "org": str(body.get("org", "")), "body": body,
            "dequeue_count": m.dequeue_count, "inserted_on": str(m.inserted_on), **_run_info(ctx, body)}


def _body(m: Any) -> dict[str, Any]:
    try:
        return decode(m.content)
    except ValueError:
        return {"unreadable": str(m.content)[:500]}


def poison(ctx: Context, principal: Principal, queue: str) -> dict[str, Any]:
    """Peek (visibility unchanged, so a replay right after sees every message)."""
    require(principal, Role.admin)
    q = _queue(queue)
    client = ctx.queues.client(q.poison)
    items = [_item(ctx, m) for m in client.peek_messages(max_messages=PEEK_LIMIT)]
    return {"queue": q.poison, "length": ctx.queues.length(q.poison), "items": items}


def _take(ctx: Context, q: Queue, message_id: str | None) -> list[Any]:
    """Receive poison messages (one by id, or all), hidden while they are handled.

    Messages passed over while looking for one id stay hidden until the search ends (so
    the search cannot see them twice), then are made visible again.
    """
    client = ctx.queues.client(q.poison)
    taken: list[Any] = []
    passed: list[Any] = []
    while not (message_id and taken):
        batch = list(client.receive_messages(messages_per_page=PEEK_LIMIT, max_messages=PEEK_LIMIT,
                                             visibility_timeout=TAKE_VISIBILITY_S))
        if not batch:
            break
        for m in batch:
            (taken if message_id is None or m.id == message_id else passed).append(m)
    for m in passed:
        client.update_message(m, visibility_timeout=0)
    return taken


def replay(ctx: Context, principal: Principal, queue: str, message_id: str | None) -> dict[str, Any]:
    require(principal, Role.admin)
    q = _queue(queue)
    queues_, store = ctx.queues, ctx.store
    taken = _take(ctx, q, message_id)
    if message_id and not taken:
        raise NotFound(f"no poison message {message_id} in {q.poison}")
    client = queues_.client(q.poison)
    for m in taken:
        body = _body(m)
        if "unreadable" in body and len(body) == 1:
            # Sent back as it was: encoding {"unreadable": ...} would wrap it in a message no step sent.
            queues_.client(q.value).send_message(m.content)
        else:
            queues_.send(q, body)  # sent first: a crash here duplicates (harmless), never loses
        client.delete_message(m.id, m.pop_receipt)
        store.audit.add("poison-replay", queue=q.value, message_id=m.id, by=principal.sub,
                    run_id=str(body.get("run_id", "")), org=str(body.get("org", "")))
    return {"replayed": [m.id for m in taken]}


def discard(ctx: Context, principal: Principal, queue: str, message_id: str) -> dict[str, Any]:
    require(principal, Role.admin)
    q = _queue(queue)
    taken = _take(ctx, q, message_id)
    if not taken:
        raise NotFound(f"no poison message {message_id} in {q.poison}")
    client, store = ctx.queues.client(q.poison), ctx.store
    for m in taken:
        body = _body(m)
        # Audited before the delete: the body is the only record of what was dropped.
        store.audit.add("poison-discard", queue=q.value, message_id=m.id, by=principal.sub,
                    run_id=str(body.get("run_id", "")), org=str(body.get("org", "")), body=body)
        client.delete_message(m.id, m.pop_receipt)
    return {"discarded": [m.id for m in taken]}


def sweep(ctx: Context, principal: Principal, body: SweepRequest) -> dict[str, Any]:
    """Start a sweep of every compute connection: one sweep-account message each, answered at once
    (a sweep of thousands of accounts outlives any HTTP request); its findings gather under its id."""
    require(principal, Role.admin)
    out = fan_out(ctx, dry_run=body.dry_run, report=True)
    return {**out, "status_url": f"/api/platform/sweeps/{out['sweep_id']}"}


def sweep_report(ctx: Context, principal: Principal, sweep_id: str) -> dict[str, Any]:
    require(principal, Role.admin)
    if not re.fullmatch(r"s[0-9]{14}-[0-9a-f]{6}", sweep_id or ""):
        raise NotFound(f"sweep {sweep_id!r:.40} not found")
    return report(ctx, sweep_id)
