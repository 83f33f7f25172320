"""Queue names (one enum) and helpers that encode like the Functions host.

The host's queue trigger expects base64 message text (host.json messageEncoding:
base64), so everything sent here is UTF-8 JSON, base64-encoded.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from pydantic import BaseModel


class Queue(StrEnum):
    validate_connection = "validate-connection"
    refresh_catalog = "refresh-catalog"
    launch = "launch"
    verify_adapter = "verify-adapter"
    retain = "retain"
    release = "release"

    @property
    def poison(self) -> str:
        return f"{self.value}-poison"


MAX_DELAY_S = 7 * 24 * 3600 - 1  # the service's visibility-timeout ceiling
# Tests that drive steps in-process with a simulated clock set this to 0.
DELAY_SCALE = 1.0
# Called with the queue name after each send without delay; the local host hooks in here
# to wake its idle pollers (the real host polls; locally the wait is avoidable).
on_send: list[Callable[[str], None]] = []


def encode(body: BaseModel | dict[str, Any]) -> str:
    text = body.model_dump_json() if isinstance(body, BaseModel) else json.dumps(body)
    return base64.b64encode(text.encode()).decode()


def decode(text: str) -> dict[str, Any]:
    try:
        raw = base64.b64decode(text, validate=True).decode()
    except ValueError:
        raw = text  # a message put by hand without encoding
    result: dict[str, Any] = json.loads(raw)
    return result


@dataclass(frozen=True)
class PoisonMessage:
    id: str
    pop_receipt: str
    body: dict[str, Any]
    inserted_on: str
    dequeue_count: int


class Queues:
    """Send, and the admin operations on poison queues."""

    def __init__(self, connection_string: str) -> None:
        from azure.storage.queue import QueueServiceClient

        self._service = QueueServiceClient.from_connection_string(connection_string)
        self._clients: dict[str, Any] = {}

    def client(self, name: str) -> Any:
        if name not in self._clients:
            from azure.core.exceptions import ResourceExistsError

            c = self._service.get_queue_client(name)
            try:
                c.create_queue()
            except ResourceExistsError:
                pass
            self._clients[name] = c
        return self._clients[name]

    def send(self, queue: Queue | str, body: BaseModel | dict[str, Any], delay_s: float = 0) -> None:
        delay = max(0, min(int(delay_s * DELAY_SCALE), MAX_DELAY_S))
        self.client(str(queue)).send_message(encode(body), visibility_timeout=delay or None)
        if not delay:
            for hook in on_send:
                hook(str(queue))

    def length(self, name: str) -> int:
        return int(self.client(name).get_queue_properties().approximate_message_count)

    def peek_poison(self, queue: Queue, limit: int = 32) -> list[PoisonMessage]:
        """Receive with a short visibility so admins can see ids and receipts."""
        msgs = self.client(queue.poison).receive_messages(messages_per_page=limit, visibility_timeout=1)
        out = []
        for m in msgs:
            out.append(PoisonMessage(m.id, m.pop_receipt, decode(m.content), str(m.inserted_on), m.dequeue_count))
            if len(out) >= limit:
                break
        return out

    def take_poison(self, queue: Queue, message_id: str | None) -> list[PoisonMessage]:
        """Receive poison messages (one by id, or all) and delete them once returned."""
        taken: list[PoisonMessage] = []
        client = self.client(queue.poison)
        for m in client.receive_messages(messages_per_page=32, visibility_timeout=30):
            if message_id is None or m.id == message_id:
                taken.append(PoisonMessage(m.id, m.pop_receipt, decode(m.content), str(m.inserted_on), m.dequeue_count))
            else:
                client.update_message(m, visibility_timeout=0)  # not ours: visible again at once
        return taken

    def delete_poison(self, queue: Queue, msg: PoisonMessage) -> None:
        self.client(queue.poison).delete_message(msg.id, msg.pop_receipt)

    def clear_all(self) -> None:
        for q in Queue:
            for name in (q.value, q.poison):
                self.client(name).clear_messages()


_override: Queues | None = None


@lru_cache(maxsize=1)
def _default() -> Queues:
    from shared.settings import get_settings

    return Queues(get_settings().storage_connection)


def get_queues() -> Queues:
    return _override or _default()


def set_queues(q: Queues | None) -> None:
    global _override
    _override = q
