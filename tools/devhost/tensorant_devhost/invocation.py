"""Calling one function: its trigger value, its output bindings, the invocation's log lines.

Invoker is the part every trigger kind (HTTP, queue, timer) and the Host share: the app's
functions, the host.json settings, the stop event, the queue clients that output
bindings send through, and the worker whose one pool runs every invocation under
functionTimeout (worker.py). The Host (host.py) sets all of its attributes.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import logging
import os
import threading
import time
import traceback
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorant_devhost.config import HostConfig
from tensorant_devhost.functions import FunctionInfo
from tensorant_devhost.logger import log
from tensorant_devhost.worker import FunctionTimeout, Invocation, Worker, WorkerRestarted, default_threads, timespan

AZURITE_ALIAS = "UseDevelopmentStorage=true"

# Housekeeping that ticks while nobody does anything: the timers (heartbeat-check every minute, the
# sweeper every five) and the sweeper's fan-out, one sweep-account message per connection. An idle
# terminal printed three lines a minute of them (one JSON) and buried the warnings. Their lines, and
# the app's info lines while they run, are debug lines (`make run --verbose` shows them); a warning
# or an error they log, and a failed invocation, still show. What they act on shows as the steps
# they send (retain, release), which are not quiet.
QUIET_QUEUE_FUNCTIONS = frozenset({"sweep_account"})
_housekeeping = threading.local()


def is_housekeeping(f: FunctionInfo) -> bool:
    return f.kind == "timer" or (f.kind == "queue" and f.name in QUIET_QUEUE_FUNCTIONS)


class QuietHousekeeping(logging.Filter):
    """Drops the app's records under WARNING logged while a housekeeping invocation runs on this
    thread, unless the dev host's own log is at debug level (every line asked for)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or not getattr(_housekeeping, "on", False):
            return True
        return log.isEnabledFor(logging.DEBUG)


_QUIET = QuietHousekeeping()


def quiet_housekeeping(app_logger: str = "tensorant") -> None:
    """Install the filter on the app's logger (idempotent): its records are filtered before any handler."""
    logger = logging.getLogger(app_logger)
    if _QUIET not in logger.filters:
        logger.addFilter(_QUIET)


class _Out:
    """An output binding value holder (azure.functions.Out)."""

    def __init__(self) -> None:
        self.value: Any = None

    def set(self, val: Any) -> None:
        self.value = val

    def get(self) -> Any:
        return self.value


@dataclass
class _Context:
    invocation_id: str
    function_name: str
    function_directory: str
    thread_local_storage: Any = field(default_factory=threading.local)
    trace_context: Any = None
    retry_context: Any = None


async def _await(awaitable: Any) -> Any:
    return await awaitable


# The started hosts of this process (Host.start adds, Host.stop removes), for notify().
running_hosts: weakref.WeakSet[Invoker] = weakref.WeakSet()


def notify(queue_name: str) -> None:
    """A message was just sent to `queue_name`: wake the pollers of every running host in this process.

    Like the Functions host's SharedQueueWatcher, this skips the idle backoff for messages
    the process itself enqueues (output bindings do it automatically; other senders may call it).
    """
    for host in list(running_hosts):
        event = host._wake.get(queue_name)
        if event is not None:
            event.set()


class Invoker:
    root: Path
    config: HostConfig
    functions: list[FunctionInfo]
    _stop: threading.Event
    _wake: dict[str, threading.Event]  # per queue name: set by notify() to poll at once
    _clients: dict[tuple[str, str], Any]
    _clients_lock: threading.Lock
    _worker: Worker | None  # the language worker now running invocations (worker.py); None until first used
    _worker_lock: threading.Lock

    def by_kind(self, kind: str) -> list[FunctionInfo]:
        return [f for f in self.functions if f.kind == kind]

    def invoke(self, f: FunctionInfo, trigger_value: Any, detail: str = "") -> Any:
        """Call the user function on the worker's pool with its trigger and output bindings; wait
        for it at most functionTimeout (counted from now: waiting for a thread counts, as on
        Azure), else restart the worker (worker.py). Logs name, duration, outcome."""
        invocation_id = str(uuid.uuid4())
        kwargs: dict[str, Any] = {f.arg_name: trigger_value}
        outs: dict[str, _Out] = {}
        for b in f.bindings:
            if b.get("direction") == 1 and b.get("name") != "$return":  # OUT binding parameter
                outs[b["name"]] = kwargs[b["name"]] = _Out()
        params = inspect.signature(f.func).parameters
        if "context" in params:
            kwargs["context"] = _Context(invocation_id, f.name, str(self.root))

        quiet = is_housekeeping(f)

        def call() -> Any:
            _housekeeping.on = quiet  # on the worker's thread, where the function logs
            try:
                result = f.func(**kwargs)
                if inspect.isawaitable(result):
                    result = asyncio.run(_await(result))
                return result
            finally:
                _housekeeping.on = False

        started = time.perf_counter()
        # HTTP requests are debug lines: `runs watch` and the agents' heartbeats poll every second or
        # two, and would bury the steps, warnings and errors (`make run` shows them on request:
        # TENSORANT_LOG_REQUESTS=1). A failed invocation is an error line whatever its trigger.
        level = logging.DEBUG if f.kind == "http" or quiet else logging.INFO
        log.log(level, "Executing 'Functions.%s' (%s, Id=%s)", f.name, detail or f.kind, invocation_id)
        try:
            result = self._run_on_worker(Invocation(invocation_id, f.name, call))
            for b in f.bindings:  # the host sends output bindings once the worker answered
                if b.get("direction") == 1 and b.get("type") == "queue":
                    value = result if b["name"] == "$return" else outs[b["name"]].get()
                    self._send_output(b, value)
        except Exception as exc:
            ms = (time.perf_counter() - started) * 1000
            log.error("Executed 'Functions.%s' (Failed, Id=%s, Duration=%.0fms): %s: %s\n%s", f.name,
                      invocation_id, ms, type(exc).__name__, exc, traceback.format_exc().rstrip())
            exc._devhost_logged = True  # type: ignore[attr-defined]
            raise
        ms = (time.perf_counter() - started) * 1000
        log.log(level, "Executed 'Functions.%s' (Succeeded, Id=%s, Duration=%.0fms)", f.name, invocation_id, ms)
        return result

    def _run_on_worker(self, inv: Invocation) -> Any:
        worker = self._current_worker()
        worker.submit(inv)
        timeout_s = self.config.function_timeout_s
        if not inv.done.wait(timeout_s):
            log.error("Timeout value of %s exceeded by function 'Functions.%s' (Id: '%s'). Initiating cancellation.",
                      timespan(timeout_s), inv.name, inv.id)
            self._restart_worker(worker, inv)
            inv.done.wait()  # settled now: failed by the restart, or finished at the same moment
        if inv.error is not None:
            raise inv.error
        return inv.result

    def _current_worker(self) -> Worker:
        with self._worker_lock:
            if self._worker is None:
                self._worker = Worker(self.config.worker_threads or default_threads())
            return self._worker

    def _restart_worker(self, old: Worker, culprit: Invocation) -> None:
        """As the host on a timeout: a fresh worker for what comes next; everything the old one held fails."""
        with self._worker_lock:
            if self._worker is not old:
                return  # another timeout restarted it already (and failed this invocation with it)
            self._worker = Worker(old.threads)
        log.error("A function timeout has occurred. Restarting worker process executing invocationId '%s'.",
                  culprit.id)
        timeout = timespan(self.config.function_timeout_s)

        def error_for(inv: Invocation) -> BaseException:
            if inv is culprit:
                return FunctionTimeout(f"Timeout value of {timeout} was exceeded by function: Functions.{inv.name}")
            return WorkerRestarted(f"the worker was restarted (invocation {culprit.id} of Functions.{culprit.name} "
                                   f"timed out) while Functions.{inv.name} ran")

        for inv in old.kill(error_for):
            if inv is not culprit:
                log.error("Invocation %s of 'Functions.%s' failed: its worker was restarted", inv.id, inv.name)

    def _stop_worker(self) -> None:
        with self._worker_lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()

    def _send_output(self, binding: dict[str, Any], value: Any) -> None:
        if value is None:
            return
        client = self._queue_client(str(binding.get("connection") or "AzureWebJobsStorage"), binding["queueName"])
        for item in value if isinstance(value, list) else [value]:
            text = item if isinstance(item, str | bytes) else json.dumps(item)
            raw = text.encode() if isinstance(text, str) else text
            client.send_message(self._encode(raw))
        notify(str(binding["queueName"]))

    def _encode(self, raw: bytes) -> str:
        return base64.b64encode(raw).decode() if self.config.message_encoding == "base64" else raw.decode()

    def _queue_client(self, connection: str, queue_name: str) -> Any:
        key = (connection, queue_name)
        with self._clients_lock:
            if key not in self._clients:
                from azure.core.exceptions import ResourceExistsError
                from azure.storage.queue import QueueClient

                conn = os.environ.get(connection, "")
                if not conn:
                    raise RuntimeError(f"queue trigger on {queue_name!r}: app setting {connection!r} is not set "
                                       "(put a storage connection string there, or run `make run`)")
                if conn.strip() == AZURITE_ALIAS:
                    from shared.settings import AZURITE

                    conn = AZURITE
                client = QueueClient.from_connection_string(conn, queue_name)
                try:
                    client.create_queue()
                except ResourceExistsError:
                    pass
                self._clients[key] = client
            return self._clients[key]
