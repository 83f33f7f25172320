"""The local host: runs exactly the functions a FunctionApp registered.

Host wires the three trigger kinds together and runs them on background threads:
- HTTP triggers (serving.py): waitress on http://127.0.0.1:<port>/<routePrefix>/<route>, for the
  configured host names only; authLevel honoured.
- Queue triggers (queues.py): Azure Storage queues polled with host.json semantics (batches,
  leases renewed while a function runs, release on failure, poison queues, idle backoff).
- Timer triggers (timers.py): NCRONTAB schedules (seconds first); runOnStartup honoured, and a
  missed occurrence run once, past due, after a restart.
The functions come from the app itself (functions.py); invocation.py calls them, each on the
worker's one pool under functionTimeout (worker.py). Where the real host differs from a plain
server, this host does what the real one does (docs/devhost.md).

Tests use `pump()` / `drain()` instead of the background pollers for determinism.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tensorant_devhost.config import HostConfig, load_local_settings
from tensorant_devhost.functions import describe_functions, load_app
from tensorant_devhost.invocation import quiet_housekeeping, running_hosts
from tensorant_devhost.queues import QueueTriggers
from tensorant_devhost.serving import HttpTriggers, fork_http_worker, listen_socket, serve, shutdown_server
from tensorant_devhost.timers import TimerTriggers, next_fire


class Host(HttpTriggers, QueueTriggers, TimerTriggers):
    """Run a FunctionApp locally.

    Host(app_or_spec, root=None, port=7071, host="127.0.0.1", config=None, load_settings=True,
         cors=None, http=True, queues=True, timers=True)
      .start() -> Host      serve HTTP, start queue pollers and timers (background threads)
      .stop()               stop all of them, wait for running invocations
      .pump() -> int        process the currently visible messages of every queue trigger once
      .drain() -> int       pump until no queue has a visible message (bounded)
      .run_timer(name)      invoke one timer function now
      .url                  http://127.0.0.1:<port> (port=0 picks a free one on start)
    """

    def __init__(
        self,
        app: Any = "function_app:app",
        *,
        root: str | Path | None = None,
        port: int = 7071,
        host: str = "127.0.0.1",
        config: HostConfig | None = None,
        load_settings: bool = True,
        cors: str | None = None,
        http: bool = True,
        queues: bool = True,
        timers: bool = True,
        http_workers: int = 1,
        credentials_first: bool = False,
        allowed_hosts: tuple[str, ...] = (),
    ) -> None:
        """http_workers: processes serving HTTP on one listening socket, as the Functions host's
        FUNCTIONS_WORKER_PROCESS_COUNT spreads invocations over Python workers (one interpreter
        lock each). The extra ones are forked at start() and serve HTTP only; queues and timers
        stay in this process.

        allowed_hosts: host names served besides localhost, 127.0.0.1, [::1], the bound address and
        TENSORANT_PUBLIC_URL's host; a request naming any other in its Host header is refused (421),
        so a web page rebound by DNS to 127.0.0.1 cannot drive this host."""
        if http_workers < 1:
            raise ValueError("http_workers must be at least 1")
        # True: a request without an Authorization header reaches its function with an empty body, so
        # an unauthenticated upload is refused without being read (for apps whose every route that
        # takes a body needs credentials, as Tensorant's; `make run` sets it).
        self.credentials_first = credentials_first
        self.http_workers = http_workers
        self._children: list[int] = []
        self.root = Path(root) if root is not None else Path.cwd()
        host_section: dict[str, Any] = {}
        if load_settings:
            # Before importing the app: modules may read settings at import time, as under func start.
            host_section = load_local_settings(self.root / "local.settings.json")
        self.app = load_app(app) if isinstance(app, str) else app
        self.config = config or HostConfig.load(self.root)
        self.functions = describe_functions(self.app)
        self.port = port
        self.bind = host
        self.cors = cors if cors is not None else host_section.get("CORS")
        self.enable = {"http": http, "queue": queues, "timer": timers}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: Any = None  # waitress's server
        self._clients: dict[tuple[str, str], Any] = {}
        self._clients_lock = threading.Lock()
        self._pools: list[ThreadPoolExecutor] = []
        self._wake: dict[str, threading.Event] = {}
        self._worker = None
        self._worker_lock = threading.Lock()
        self.allowed_hosts = allowed_hosts
        # Routes in ASP.NET precedence: literal segments win over parameters.
        self._routes = sorted((f for f in self.functions if f.kind == "http"), key=lambda f: f.route.precedence)  # type: ignore[union-attr]

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}"

    def start(self) -> Host:
        self._stop.clear()
        quiet_housekeeping()
        if self.enable["http"] and self.by_kind("http"):
            sock = None
            if self.http_workers > 1:
                # Forked before this host starts any thread: a child gets no half-held lock.
                sock = listen_socket(self.bind, self.port)
                self._children = [fork_http_worker(self, sock) for _ in range(self.http_workers - 1)]
            self._server = serve(self, sock)
            self.port = int(self._server.effective_port)
            self._spawn(self._server.run, "devhost-http")
        running_hosts.add(self)
        if self.enable["queue"]:
            for f in self.by_kind("queue"):
                self._wake[f.queue_name] = threading.Event()
                self._spawn(functools.partial(self._listen, f), f"devhost-queue-{f.queue_name}")
        if self.enable["timer"]:
            for f in self.by_kind("timer"):
                next_fire(f.schedule, datetime.now(UTC))  # a bad schedule fails start, not a thread
                self._spawn(functools.partial(self._timer_loop, f), f"devhost-timer-{f.name}")
        return self

    def stop(self) -> None:
        self._stop.set()
        running_hosts.discard(self)
        for event in self._wake.values():
            event.set()
        for pid in self._children:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self._children.clear()
        if self._server is not None:
            shutdown_server(self._server)
            self._server = None
        for t in self._threads:
            t.join(timeout=15)
        self._threads.clear()
        for pool in self._pools:
            pool.shutdown(wait=True)
        self._pools.clear()
        self._stop_worker()
        with self._clients_lock:
            for client in self._clients.values():
                try:
                    client.close()  # idle keep-alive connections would hold up Azurite's shutdown
                except Exception:
                    pass
            self._clients.clear()

    def __enter__(self) -> Host:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)
