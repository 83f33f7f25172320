"""The local host: runs exactly the functions a FunctionApp registered.

- HTTP triggers are served on http://127.0.0.1:<port>/<routePrefix>/<route> by waitress (a
  maintained WSGI server: a bounded thread pool, a real listen backlog, idle-connection
  timeouts, strict Content-Length / chunked parsing that answers 400, TCP_NODELAY, headers
  and small bodies in one write). http.server had none of these.
- Queue triggers poll Azure Storage queues with host.json semantics: batchSize messages
  per poll processed concurrently, base64 message encoding, delete on success, release
  for visibilityTimeout on failure, move the original text to `<queue>-poison` once
  dequeueCount reaches maxDequeueCount, back off up to maxPollingInterval when idle.
- Timer triggers fire on their NCRONTAB schedules (seconds first); runOnStartup honoured.

Tests use `pump()` / `drain()` instead of the background pollers for determinism.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import importlib
import inspect
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tensorant_devhost.config import HostConfig, load_local_settings, timespan_s
from tensorant_devhost.routes import RouteTemplate

log = logging.getLogger("tensorant.devhost")
if not log.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    # The app's Powertools logger is named "tensorant": do not print every line twice through it.
    log.propagate = False

ALL_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE"})
MIN_POLL_S = 0.1
# HTTP serving limits: invocations run on at most HTTP_THREADS threads at once; connections
# beyond them wait in the listen backlog (http.server's was 5) instead of being reset.
HTTP_THREADS = 16
HTTP_BACKLOG = 1024
HTTP_CONNECTION_LIMIT = 256
HTTP_IDLE_TIMEOUT_S = 120  # an idle keep-alive connection is closed after this
MAX_REQUEST_BODY = 1024 * 1024 * 1024 + 1024 * 1024  # the app's largest upload (1 GiB) and its envelope
AZURITE_ALIAS = "UseDevelopmentStorage=true"


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass
class FunctionInfo:
    """One registered function, as read from the FunctionApp (never from a second list)."""

    name: str
    kind: str  # http | queue | timer | other
    trigger: dict[str, Any]
    bindings: list[dict[str, Any]]
    func: Callable[..., Any]
    route: RouteTemplate | None = None
    methods: frozenset[str] = ALL_METHODS
    queue_name: str = ""
    connection: str = "AzureWebJobsStorage"
    schedule: str = ""
    run_on_startup: bool = False

    @property
    def arg_name(self) -> str:
        return str(self.trigger["name"])


def load_app(spec: str = "function_app:app") -> Any:
    """Import `module:attr` (attr defaults to `app`)."""
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr or "app")


# FunctionApp.get_functions() refuses to run twice on one app (it re-checks names against its
# own earlier result), so several hosts over one app (tests) share the first answer.
_indexed: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def describe_functions(app: Any) -> list[FunctionInfo]:
    if app not in _indexed:
        _indexed[app] = list(app.get_functions())
    out: list[FunctionInfo] = []
    for fn in _indexed[app]:
        trigger = {k: _plain(v) for k, v in fn.get_trigger().get_dict_repr().items()}
        bindings = [{k: _plain(v) for k, v in b.get_dict_repr().items()} for b in fn.get_bindings()]
        name = fn.get_function_name()
        info = FunctionInfo(name=name, kind="other", trigger=trigger, bindings=bindings, func=fn.get_user_function())
        ttype = trigger.get("type")
        if ttype == "httpTrigger":
            info.kind = "http"
            info.route = RouteTemplate(trigger.get("route") or name)
            if info.route.template.lower().split("/")[0].startswith("admin"):
                # The real host refuses these (its own admin API lives there); fail here too.
                raise ValueError(f"function {name}: route {info.route.template!r} starts with 'admin', "
                                 "which the Functions host reserves; choose another route")
            if trigger.get("methods"):
                info.methods = frozenset(str(m).upper() for m in trigger["methods"])
        elif ttype == "queueTrigger":
            info.kind = "queue"
            info.queue_name = resolve_setting(str(trigger["queueName"]))
            info.connection = str(trigger.get("connection") or "AzureWebJobsStorage")
        elif ttype == "timerTrigger":
            info.kind = "timer"
            info.schedule = str(trigger["schedule"])
            info.run_on_startup = bool(trigger.get("runOnStartup", False))
        else:
            log.warning("function %s: trigger %s is not supported by the dev host; skipped", name, ttype)
        out.append(info)
    return out


def resolve_setting(value: str) -> str:
    """`%NAME%` means the app setting NAME, as in function.json."""
    if len(value) > 2 and value.startswith("%") and value.endswith("%"):
        return os.environ.get(value[1:-1], "")
    return value


def next_fire(schedule: str, after: datetime) -> datetime:
    """Next occurrence of an NCRONTAB (6 fields, seconds first; 5 fields accepted) or a TimeSpan schedule."""
    schedule = resolve_setting(schedule).strip()
    if ":" in schedule and " " not in schedule:
        period = timespan_s(schedule, 0)
        if period <= 0:
            raise ValueError(f"timer schedule {schedule!r} must be positive")
        return datetime.fromtimestamp(after.timestamp() + period, tz=UTC)
    from croniter import croniter

    fields = schedule.split()
    if len(fields) not in (5, 6):
        raise ValueError(f"timer schedule {schedule!r} is not NCRONTAB ({{second}} {{minute}} {{hour}} ...)")
    it = croniter(schedule, after, second_at_beginning=len(fields) == 6)
    result: datetime = it.get_next(datetime)
    return result


_running: weakref.WeakSet[Host] = weakref.WeakSet()


def notify(queue_name: str) -> None:
    """A message was just sent to `queue_name`: wake the pollers of every running host in this process.

    Like the Functions host's SharedQueueWatcher, this skips the idle backoff for messages
    the process itself enqueues (output bindings do it automatically; other senders may call it).
    """
    for host in list(_running):
        event = host._wake.get(queue_name)
        if event is not None:
            event.set()


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


class Host:
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
    ) -> None:
        """http_workers: processes serving HTTP on one listening socket, as the Functions host's
        FUNCTIONS_WORKER_PROCESS_COUNT spreads invocations over Python workers (one interpreter
        lock each). The extra ones are forked at start() and serve HTTP only; queues and timers
        stay in this process."""
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
        # Routes in ASP.NET precedence: literal segments win over parameters.
        self._routes = sorted((f for f in self.functions if f.kind == "http"), key=lambda f: f.route.precedence)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}"

    def by_kind(self, kind: str) -> list[FunctionInfo]:
        return [f for f in self.functions if f.kind == kind]

    def start(self) -> Host:
        self._stop.clear()
        if self.enable["http"] and self.by_kind("http"):
            sock = None
            if self.http_workers > 1:
                # Forked before this host starts any thread: a child gets no half-held lock.
                sock = _listen_socket(self.bind, self.port)
                self._children = [_fork_http_worker(self, sock) for _ in range(self.http_workers - 1)]
            self._server = _serve(self, sock)
            self.port = int(self._server.effective_port)
            self._spawn(self._server.run, "devhost-http")
        _running.add(self)
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
        _running.discard(self)
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
            _shutdown(self._server)
            self._server = None
        for t in self._threads:
            t.join(timeout=15)
        self._threads.clear()
        for pool in self._pools:
            pool.shutdown(wait=True)
        self._pools.clear()
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

    # ------------------------------------------------------------------ invocation

    def invoke(self, f: FunctionInfo, trigger_value: Any, detail: str = "") -> Any:
        """Call the user function with its trigger and output bindings; log name, duration, outcome."""
        invocation_id = str(uuid.uuid4())
        kwargs: dict[str, Any] = {f.arg_name: trigger_value}
        outs: dict[str, _Out] = {}
        for b in f.bindings:
            if b.get("direction") == 1 and b.get("name") != "$return":  # OUT binding parameter
                outs[b["name"]] = kwargs[b["name"]] = _Out()
        params = inspect.signature(f.func).parameters
        if "context" in params:
            kwargs["context"] = _Context(invocation_id, f.name, str(self.root))
        started = time.perf_counter()
        # HTTP requests are debug lines: `runs watch` and the agents' heartbeats poll every second or
        # two, and would bury the steps, warnings and errors (`make run` shows them on request:
        # TENSORANT_LOG_REQUESTS=1). A failed invocation is an error line whatever its trigger.
        level = logging.DEBUG if f.kind == "http" else logging.INFO
        log.log(level, "Executing 'Functions.%s' (%s, Id=%s)", f.name, detail or f.kind, invocation_id)
        try:
            result = f.func(**kwargs)
            if inspect.isawaitable(result):
                result = asyncio.run(_await(result))
            for b in f.bindings:
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

    # ------------------------------------------------------------------ queues

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

    def _receive(self, f: FunctionInfo, count: int) -> list[Any]:
        client = self._queue_client(f.connection, f.queue_name)
        pages = client.receive_messages(messages_per_page=count, max_messages=count,
                                        visibility_timeout=self.config.processing_lease_s)
        return list(pages)

    def _process(self, f: FunctionInfo, msg: Any, release_failed: bool = True) -> tuple[bool, Any]:
        """Run one message; delete on success, poison or release on failure. Returns (ok, msg)."""
        from azure.functions.queue import QueueMessage

        client = self._queue_client(f.connection, f.queue_name)
        max_count = self.config.max_dequeue_count
        if msg.dequeue_count > max_count:
            # Received more often than allowed without a recorded failure (a crash mid-run): poison it now.
            self._poison(f, msg, "dequeue count over maxDequeueCount before processing")
            return False, msg
        ok = False
        lease = _Lease(client, msg, self.config.processing_lease_s)
        try:
            body = self._decode(msg.content)
            qm = QueueMessage(id=msg.id, body=body, dequeue_count=msg.dequeue_count, pop_receipt=msg.pop_receipt,
                              insertion_time=msg.inserted_on, expiration_time=msg.expires_on,
                              time_next_visible=msg.next_visible_on)
            self.invoke(f, qm, f"queue={f.queue_name} id={msg.id} dequeueCount={msg.dequeue_count}")
            ok = True
        except Exception as exc:
            if not getattr(exc, "_devhost_logged", False):
                log.error("queue %s: message %s failed before its function ran: %s", f.queue_name, msg.id, exc)
        finally:
            msg.pop_receipt = lease.end()  # the receipt of the last renewal settles the message
        try:
            if ok:
                client.delete_message(msg.id, msg.pop_receipt)
            elif msg.dequeue_count >= max_count:
                self._poison(f, msg, f"failed {msg.dequeue_count} times (maxDequeueCount={max_count})")
            elif release_failed:
                self.release(f, msg)
        except Exception as exc:  # the message reappears after its lease; the host keeps going
            log.error("queue %s: could not settle message %s: %s", f.queue_name, msg.id, exc)
        return ok, msg

    def release(self, f: FunctionInfo, msg: Any) -> None:
        """Make a failed message visible again after visibilityTimeout."""
        client = self._queue_client(f.connection, f.queue_name)
        client.update_message(msg.id, msg.pop_receipt, visibility_timeout=int(self.config.visibility_timeout_s))

    def _poison(self, f: FunctionInfo, msg: Any, why: str) -> None:
        poison = self._queue_client(f.connection, f"{f.queue_name}-poison")
        poison.send_message(msg.content)  # the original text, still encoded
        self._queue_client(f.connection, f.queue_name).delete_message(msg.id, msg.pop_receipt)
        log.warning("queue %s: message %s moved to %s-poison (%s)", f.queue_name, msg.id, f.queue_name, why)

    def _decode(self, content: str | bytes) -> bytes:
        raw = content.encode() if isinstance(content, str) else content
        if self.config.message_encoding != "base64":
            return raw
        try:
            return base64.b64decode(raw, validate=True)
        except binascii.Error as exc:
            raise ValueError("message decoding failed: the text is not base64 (host.json messageEncoding "
                             "is base64; send with shared.queues)") from exc

    def _listen(self, f: FunctionInfo) -> None:
        pool = ThreadPoolExecutor(max_workers=self.config.batch_size, thread_name_prefix=f"devhost-{f.queue_name}")
        self._pools.append(pool)
        in_flight: set[Any] = set()
        lock = threading.Lock()
        delay = MIN_POLL_S
        last_error = ""
        wake = self._wake[f.queue_name]

        def done(fut: Any) -> None:
            with lock:
                in_flight.discard(fut)

        while not self._stop.is_set():
            with lock:
                busy = len(in_flight)
            if busy > self.config.new_batch_threshold:
                self._stop.wait(0.05)
                continue
            try:
                msgs = self._receive(f, self.config.batch_size)
                last_error = ""
            except Exception as exc:
                if str(exc) != last_error:  # say it once, not on every poll
                    log.error("queue %s: receive failed (retrying): %s", f.queue_name, exc)
                last_error = str(exc)
                msgs = []
                delay = self.config.max_polling_interval_s
            for m in msgs:
                fut = pool.submit(self._process, f, m)
                with lock:
                    in_flight.add(fut)
                fut.add_done_callback(done)
            if msgs:
                delay = MIN_POLL_S
                if len(msgs) == self.config.batch_size:
                    continue  # probably more waiting: poll again at once
            else:
                delay = min(delay * 2, self.config.max_polling_interval_s)
            if wake.wait(delay):  # notify(): a message was sent here, poll at once
                wake.clear()
                delay = MIN_POLL_S

    def pump(self, max_messages: int = 1000) -> int:
        """Process the messages now visible on every queue trigger, each at most once; return the count.

        Batches of batchSize run concurrently, like the pollers. Failed messages are released only
        when the pump is done, so a message that fails is not received twice by one pump.
        """
        count = 0
        with ThreadPoolExecutor(max_workers=self.config.batch_size) as pool:
            for f in self.by_kind("queue"):
                failed: list[Any] = []
                while count < max_messages:
                    msgs = self._receive(f, min(self.config.batch_size, max_messages - count))
                    if not msgs:
                        break
                    futures = [pool.submit(self._process, f, m, False) for m in msgs]
                    wait(futures)
                    count += len(msgs)
                    for fut in futures:
                        ok, msg = fut.result()
                        if not ok and msg.dequeue_count < self.config.max_dequeue_count:
                            failed.append(msg)
                for msg in failed:
                    try:
                        self.release(f, msg)
                    except Exception as exc:
                        log.error("queue %s: could not release message %s: %s", f.queue_name, msg.id, exc)
        return count

    def drain(self, max_rounds: int = 50) -> int:
        """Pump until a round finds nothing (follows chains of queue messages); return the total."""
        total = 0
        for _ in range(max_rounds):
            n = self.pump()
            total += n
            if n == 0:
                break
        return total

    # ------------------------------------------------------------------ timers

    def run_timer(self, name: str, past_due: bool = False) -> None:
        from azure.functions.timer import TimerRequest

        f = next(x for x in self.functions if x.kind == "timer" and x.name == name)
        self.invoke(f, TimerRequest(past_due=past_due, schedule={"AdjustForDST": True}), f"timer {f.schedule}")

    def _timer_loop(self, f: FunctionInfo) -> None:
        if f.run_on_startup:
            self._fire(f, False)
        nxt = next_fire(f.schedule, datetime.now(UTC))
        while not self._stop.is_set():
            wait_s = nxt.timestamp() - time.time()
            if wait_s > 0:
                self._stop.wait(min(wait_s, 1.0))
                continue
            self._fire(f, past_due=wait_s < -1.0)
            nxt = next_fire(f.schedule, max(datetime.now(UTC), nxt))

    def _fire(self, f: FunctionInfo, past_due: bool) -> None:
        try:
            self.run_timer(f.name, past_due)
        except Exception as exc:  # the schedule goes on
            if not getattr(exc, "_devhost_logged", False):
                log.error("timer %s: could not fire: %s: %s", f.name, type(exc).__name__, exc)

    # ------------------------------------------------------------------ http

    def handle_http(
        self, method: str, raw_path: str, headers: dict[str, str], body: bytes | Callable[[], bytes]
    ) -> tuple[int, dict[str, str], bytes]:
        """Route one request to its function; return (status, headers, body). `body` may be a reader,
        called only once a function serves the request: a request to no route (or a refused method)
        is answered without reading what it sent."""
        split = urlsplit(raw_path)
        prefix = "/" + self.config.route_prefix if self.config.route_prefix else ""
        path = split.path
        if prefix and not (path == prefix or path.startswith(prefix + "/")):
            return _problem(404, "Not Found", f"no function serves {path} (routes start with {prefix}/)")
        sub = path[len(prefix):]
        matched: list[FunctionInfo] = []
        for f in self._routes:
            params = f.route.match(sub) if f.route else None
            if params is None:
                continue
            matched.append(f)
            if method in f.methods:
                return self._call_http(f, method, split, headers, body() if callable(body) else body, params)
        if matched:
            allowed = sorted(set().union(*(f.methods for f in matched)))
            status, hdrs, out = _problem(405, "Method Not Allowed", f"{method} is not allowed on {path}")
            hdrs["Allow"] = ", ".join(allowed)
            return status, hdrs, out
        return _problem(404, "Not Found", f"no function serves {method} {path}")

    def _call_http(self, f: FunctionInfo, method: str, split: Any, headers: dict[str, str], body: bytes,
                   params: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        import azure.functions as func

        host = headers.get("host") or headers.get("Host") or f"localhost:{self.port}"
        url = f"http://{host}{split.path}" + (f"?{split.query}" if split.query else "")
        req = func.HttpRequest(method=method, url=url, headers=headers, params=dict(parse_qsl(split.query)),
                               route_params=params, body=body)
        try:
            resp = self.invoke(f, req, f"{method} {split.path}")
        except Exception as exc:
            return _problem(500, "Internal Server Error", f"function {f.name} failed: {type(exc).__name__}")
        if resp is None:
            return 204, {}, b""
        if isinstance(resp, str | bytes):
            resp = func.HttpResponse(resp)
        out = {k: v for k, v in resp.headers.items()}
        if not any(k.lower() == "content-type" for k in out):
            text_like = resp.mimetype.startswith("text/") or resp.mimetype.endswith("json")
            out["Content-Type"] = f"{resp.mimetype}; charset={resp.charset}" if text_like else resp.mimetype
        return int(resp.status_code), out, resp.get_body()


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _problem(status: int, title: str, detail: str) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail}).encode()
    return status, {"Content-Type": "application/problem+json"}, body


def _listen_socket(bind: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind, port))
    sock.listen(HTTP_BACKLOG)
    sock.setblocking(False)
    return sock


class _Lease:
    """Keeps a message invisible while its function runs: renews a short visibility lease every
    third of it (update_message hands back a new pop receipt each time), until end()."""

    def __init__(self, client: Any, msg: Any, lease_s: int) -> None:
        self.client, self.msg, self.lease_s = client, msg, lease_s
        self.receipt = msg.pop_receipt
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._renew, name=f"lease-{msg.id}", daemon=True)
        self.thread.start()

    def _renew(self) -> None:
        while not self.done.wait(self.lease_s / 3):
            try:
                updated = self.client.update_message(self.msg.id, self.receipt, visibility_timeout=self.lease_s)
                self.receipt = updated.pop_receipt
            except Exception as exc:  # the message reappears after its lease: a second delivery, which steps allow
                log.error("queue: could not renew the lease of message %s: %s", self.msg.id, exc)
                return

    def end(self) -> str:
        self.done.set()
        self.thread.join()
        return str(self.receipt)


def _fork_http_worker(host: Host, sock: socket.socket) -> int:
    """A child process serving HTTP on sock until SIGTERM or until its parent is gone."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops us

        def orphaned() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(0)

        threading.Thread(target=orphaned, daemon=True).start()
        _serve(host, sock).run()
    finally:
        os._exit(0)  # never return into the parent's code


def _serve(host: Host, sock: socket.socket | None = None) -> Any:
    """A waitress server bound to host's address (or serving a listening socket), not yet running
    (run() serves until shutdown)."""
    from waitress.server import create_server

    where: dict[str, Any] = {"sockets": [sock]} if sock is not None else {"host": host.bind, "port": host.port}
    return create_server(
        functools.partial(_wsgi, host), **where, threads=HTTP_THREADS,
        backlog=HTTP_BACKLOG, connection_limit=HTTP_CONNECTION_LIMIT, channel_timeout=HTTP_IDLE_TIMEOUT_S,
        max_request_body_size=MAX_REQUEST_BODY, ident="tensorant-devhost/2", clear_untrusted_proxy_headers=True,
        expose_tracebacks=False,
    )


def _shutdown(server: Any) -> None:
    """Stop a waitress server started by _serve: close the listener and every connection (its
    loop ends once none is left), then the worker threads (running invocations finish first)."""
    closed = threading.Event()

    def close_all() -> None:  # runs on the server's own loop thread: never under a select() in progress
        for channel in list(server._map.values()):
            try:
                # The listener has no close handler of its own (it would log "unhandled close event").
                channel.close() if channel is server else channel.handle_close()
            except Exception:
                pass
        closed.set()

    try:
        server.trigger.pull_trigger(close_all)
        closed.wait(10)
    except OSError:
        # The loop already ended and closed its trigger (a connection error took it down):
        # no select() is running any more, so closing here is safe.
        close_all()
    server.task_dispatcher.shutdown(cancel_pending=True, timeout=15)


# Response headers the server sets itself (framing is its job, never a function's).
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})


def _wsgi(host: Host, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """One request: the same routing and invocation as before, behind WSGI."""
    method = str(environ["REQUEST_METHOD"]).upper()
    # REQUEST_URI is the path as sent (PATH_INFO is decoded): routes match the raw path, as before.
    raw_path = str(environ.get("REQUEST_URI") or environ.get("PATH_INFO") or "/")
    headers = _request_headers(environ)
    length = int(environ.get("CONTENT_LENGTH") or 0)  # waitress validated it (and de-chunked the body)

    def body() -> bytes:
        # Read only once a function serves the request; with credentials_first, only from a caller
        # that sent an Authorization header (the app's routes authenticate before they parse).
        if not length or (host.credentials_first and "Authorization" not in headers):
            return b""
        return bytes(environ["wsgi.input"].read(length))

    if method == "OPTIONS" and host.cors and "Access-Control-Request-Method" in headers:
        status, out, data = 204, dict[str, str](), b""
    else:
        try:
            status, out, data = host.handle_http(method, raw_path, headers, body)
        except Exception as exc:  # a host bug must still answer, not drop the connection
            log.exception("devhost: %s %s failed before reaching a function", method, raw_path)
            status, out, data = _problem(500, "Internal Server Error", f"dev host error: {type(exc).__name__}")
    if host.cors:
        origin = headers.get("Origin", "")
        allowed = [o.strip() for o in str(host.cors).split(",")]
        if origin and ("*" in allowed or origin in allowed):
            out["Access-Control-Allow-Origin"] = "*" if "*" in allowed else origin
            out["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
            out["Access-Control-Allow-Methods"] = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
    pairs = [(k, v) for k, v in out.items() if k.lower() not in _FRAMING]
    # 1xx, 204 and 304 carry no body (RFC 9110): one sent anyway is read as the start of the
    # next response on a keep-alive connection. HEAD gets the headers only.
    no_body = status < 200 or status in (204, 304)
    if no_body or method == "HEAD":
        data = b""
    if not no_body:
        pairs.append(("Content-Length", str(len(data))))
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Status"
    start_response(f"{status} {phrase}", pairs)
    return [data]


def _request_headers(environ: dict[str, Any]) -> dict[str, str]:
    """WSGI's HTTP_* keys back to header names (Title-Case; the Functions request is case-insensitive)."""
    out: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            out["-".join(part.capitalize() for part in key[5:].split("_"))] = str(value)
    for key, name in (("CONTENT_TYPE", "Content-Type"), ("CONTENT_LENGTH", "Content-Length")):
        if environ.get(key):
            out[name] = str(environ[key])
    if "chunked" in out.get("Transfer-Encoding", "").lower():
        # waitress de-chunks and counts the body; the function must see the request as the client sent
        # it, without a length (a rule that asks for Content-Length before reading must see it missing).
        out.pop("Content-Length", None)
    return out
