"""The language worker: one pool of threads runs every invocation, and a timeout restarts it.

As in the Python worker (azure-functions-python-worker, dispatcher.py), the sync functions of
every trigger kind (HTTP, queue, timer) share one pool of min(32, cpu+4) threads
(PYTHON_THREADPOOL_THREAD_COUNT overrides it). An invocation's clock starts when the host hands
it over, not when a thread takes it: waiting for a thread counts toward functionTimeout.

On a timeout the real host restarts the whole worker process
(WebScriptHostExceptionHandler: RestartWorkerWithInvocationIdAsync), so every invocation in it
dies. A Python thread cannot be killed, so restart() is the faithful part of that: every
invocation of the old worker, running or still waiting for a thread, fails at once (the culprit
with FunctionTimeout, the others with WorkerRestarted), so their queue messages go back for a
retry and their HTTP requests answer 500; new invocations go to a fresh pool. The old pool's
threads are abandoned (daemon threads): a stuck one stays stuck, and what one that was only slow
returns later is dropped. Unlike a killed process, an abandoned thread can still act (write,
send) after the restart; the steps are idempotent, as they must be on Azure, where a worker can
die between two writes. The dev host's extra HTTP worker processes (FUNCTIONS_WORKER_PROCESS_COUNT)
each have their own pool and restart it the same way, in their own process: simpler than
re-forking a process, and what a caller sees is the same.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class FunctionTimeout(Exception):
    """The invocation ran past functionTimeout (its worker was restarted)."""


class WorkerRestarted(Exception):
    """Another invocation of the same worker timed out: the worker restarted under this one."""


def default_threads() -> int:
    """The Python worker's pool size: PYTHON_THREADPOOL_THREAD_COUNT, else min(32, cpu+4)."""
    raw = os.environ.get("PYTHON_THREADPOOL_THREAD_COUNT", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return min(32, (os.cpu_count() or 1) + 4)


def timespan(seconds: float) -> str:
    """Seconds as .NET prints a TimeSpan ("00:05:00", "00:00:00.5000000"), for the host's log lines."""
    whole = int(seconds)
    text = f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
    ticks = round((seconds - whole) * 10_000_000)
    return f"{text}.{ticks:07d}" if ticks else text


@dataclass(eq=False)
class Invocation:
    id: str
    name: str
    call: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class Worker:
    """A pool of daemon threads running invocations; kill() fails what it holds and abandons it."""

    def __init__(self, threads: int, name: str = "devhost-worker") -> None:
        self.threads = threads
        self.dead = False
        self._tasks: queue.SimpleQueue[Invocation | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._in_flight: dict[str, Invocation] = {}
        for i in range(threads):
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True).start()

    def submit(self, inv: Invocation) -> None:
        with self._lock:
            if self.dead:
                raise WorkerRestarted(f"the worker was restarted before invocation {inv.id} started")
            self._in_flight[inv.id] = inv
        self._tasks.put(inv)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def _serve(self) -> None:
        while True:
            inv = self._tasks.get()
            if inv is None or self.dead:
                return
            if inv.done.is_set():
                continue
            try:
                result, error = inv.call(), None
            except BaseException as exc:  # handed to the caller, as the worker reports a failure
                result, error = None, exc
            self._settle(inv, result, error)
            if self.dead:
                return  # abandoned while it ran: leave the dead pool

    def _settle(self, inv: Invocation, result: Any, error: BaseException | None) -> None:
        with self._lock:
            if inv.done.is_set():
                return  # failed by kill() already: a late result is dropped
            inv.result, inv.error = result, error
            self._in_flight.pop(inv.id, None)
            inv.done.set()

    def kill(self, error_for: Callable[[Invocation], BaseException]) -> list[Invocation]:
        """Fail every invocation in flight (error_for names each one's error), end idle threads,
        abandon busy ones; return the invocations failed."""
        with self._lock:
            self.dead = True
            victims = list(self._in_flight.values())
            self._in_flight.clear()
            for inv in victims:
                inv.error = error_for(inv)
                inv.done.set()
        self.close()
        return victims

    def close(self) -> None:
        """Idle threads end; a busy one ends after its call (daemon threads: none holds up exit)."""
        for _ in range(self.threads):
            self._tasks.put(None)
