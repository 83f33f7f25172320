"""The queues (one per step, named as the step) and helpers that encode like the Functions host.

The host's queue trigger expects base64 message text (host.json messageEncoding:
base64), so everything sent here is UTF-8 JSON, base64-encoded.

The process's queues are built from settings on first use. `configure()` is the one place
that changes how they send (tests: no delays; the dev host: wake its pollers on send), and
`reset_queues()` forgets them (tests, after changing settings).
"""

from __future__ import annotations

import base64
import json
import math
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from shared.settings import get_settings
from shared.steps import Step
from shared.storage_account import service_client
from shared.storage_transport import storage_client_kwargs

# Every step has its own queue, of the same name.
Queue = Step

MAX_DELAY_S = 7 * 24 * 3600 - 1  # the service's visibility-timeout ceiling

SendHook = Callable[[str], None]


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


class Queues:
    """Send, and each queue's client: the poison queues' list, replay and discard are
    shared/services/api/admin.py's, on `client()` (one implementation)."""

    def __init__(self, connection_string: str, *, delay_scale: float = 1.0, on_send: Iterable[SendHook] = ()) -> None:
        """delay_scale multiplies every delay (0: tests that drive steps in-process on a simulated
        clock); on_send hooks are called with the queue name after each send without delay (the
        dev host wakes its idle pollers: the real host polls, locally the wait is avoidable)."""
        from azure.storage.queue import QueueServiceClient

        self._service = service_client(QueueServiceClient, "queue", connection_string, **storage_client_kwargs())
        self._clients: dict[str, Any] = {}
        self.delay_scale = delay_scale
        self.on_send: tuple[SendHook, ...] = tuple(on_send)

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
        # Rounded up: the service counts whole seconds, and a scaled delay must not vanish.
        delay = max(0, min(math.ceil(delay_s * self.delay_scale), MAX_DELAY_S))
        self.client(str(queue)).send_message(encode(body), visibility_timeout=delay or None)
        if not delay:
            for hook in self.on_send:
                hook(str(queue))

    def length(self, name: str) -> int:
        return int(self.client(name).get_queue_properties().approximate_message_count)


@dataclass(frozen=True)
class _Options:
    delay_scale: float = 1.0
    on_send: tuple[SendHook, ...] = ()


_options = _Options()
_default: Queues | None = None
_lock = threading.Lock()  # the chaos test sends from several threads


def configure(*, delay_scale: float | None = None, on_send: Iterable[SendHook] | None = None) -> Callable[[], None]:
    """Set how the process's queues send (see Queues); None leaves a setting as it is.

    Applies to the queues in use now and to any built later. Returns an undo that restores
    the settings as they were before this call.
    """
    global _options
    before = _options
    _options = _Options(before.delay_scale if delay_scale is None else delay_scale,
                        before.on_send if on_send is None else tuple(on_send))
    _apply()

    def undo() -> None:
        global _options
        _options = before
        _apply()

    return undo


def _apply() -> None:
    if _default is not None:
        _default.delay_scale, _default.on_send = _options.delay_scale, _options.on_send


def get_queues() -> Queues:
    global _default
    with _lock:
        if _default is None:
            _default = Queues(get_settings().storage_connection, delay_scale=_options.delay_scale,
                              on_send=_options.on_send)
        return _default


def reset_queues() -> None:
    """Tests: forget the queues (the next get_queues() builds them from the current settings)
    and every configure()d setting."""
    global _default, _options
    _default = None
    _options = _Options()


def _after_fork_in_child() -> None:
    # A forked process must not share the parent's pooled connections; the settings stay.
    global _default
    _default = None


os.register_at_fork(after_in_child=_after_fork_in_child)
