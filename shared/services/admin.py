"""Platform admin: queue depths, poison messages (list, replay, discard), sweep on demand."""

from __future__ import annotations

from typing import Any

from shared.errors import InvalidInput, NotFound
from shared.models import Role, RunState, SweepRequest
from shared.queues import PoisonMessage, Queue, get_queues
from shared.security import Principal, require
from shared.store import get_store


def _queue(name: str) -> Queue:
    try:
        return Queue(name.removesuffix("-poison"))
    except ValueError as exc:
        raise InvalidInput.field("queue", f"unknown queue {name!r}; use one of {', '.join(q.value for q in Queue)}") from exc


def queues(principal: Principal) -> dict[str, Any]:
    require(principal, Role.admin)
    q = get_queues()
    return {"items": [{"name": x.value, "length": q.length(x.value), "poison_length": q.length(x.poison)}
                      for x in Queue]}


def _last_error(body: dict[str, Any]) -> str:
    org, run_id = body.get("org"), body.get("run_id")
    if not org or not run_id:
        return ""
    try:
        run, _ = get_store().get_run(str(org), str(run_id))
    except NotFound:
        return "the run no longer exists"
    errors = [e.message for e in get_store().list_events(run.id, kind="step-error")]
    return errors[-1] if errors else (run.release_error if run.state == RunState.releasing else "")


def _item(m: PoisonMessage) -> dict[str, Any]:
    return {"id": m.id, "run_id": m.body.get("run_id", ""), "org": m.body.get("org", ""), "body": m.body,
            "dequeue_count": m.dequeue_count, "inserted_on": m.inserted_on, "last_error": _last_error(m.body)}


def poison(principal: Principal, queue: str) -> dict[str, Any]:
    require(principal, Role.admin)
    return {"items": [_item(m) for m in get_queues().peek_poison(_queue(queue))]}


def replay(principal: Principal, queue: str, message_id: str | None) -> dict[str, Any]:
    require(principal, Role.admin)
    q = _queue(queue)
    taken = get_queues().take_poison(q, message_id)
    if message_id and not taken:
        raise NotFound(f"no poison message {message_id} in {q.poison} (it may be invisible for a few seconds)")
    for m in taken:
        get_queues().send(q, m.body)  # send first: a crash here duplicates (harmless), never loses
        get_queues().delete_poison(q, m)
        get_store().audit("poison-replay", queue=q.value, message_id=m.id, by=principal.sub, run_id=m.body.get("run_id", ""))
    return {"replayed": [m.id for m in taken]}


def discard(principal: Principal, queue: str, message_id: str) -> dict[str, Any]:
    require(principal, Role.admin)
    q = _queue(queue)
    taken = get_queues().take_poison(q, message_id)
    if not taken:
        raise NotFound(f"no poison message {message_id} in {q.poison}")
    for m in taken:
        get_queues().delete_poison(q, m)
        get_store().audit("poison-discard", queue=q.value, message_id=m.id, by=principal.sub, body=m.body)
    return {"discarded": [m.id for m in taken]}


def sweep(principal: Principal, body: SweepRequest) -> dict[str, Any]:
    from shared.services.sweeper import sweep as run_sweep

    require(principal, Role.admin)
    return run_sweep(dry_run=body.dry_run)
