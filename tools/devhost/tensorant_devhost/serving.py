"""HTTP triggers: the app's routes served on http://<bind>:<port>/<routePrefix>/<route>.

waitress serves them (a maintained WSGI server: a real listen backlog, idle-connection
timeouts, strict Content-Length / chunked parsing that answers 400, TCP_NODELAY, headers and
small bodies in one write); http.server had none of these. Its threads only wait: the functions
run on the worker's pool (worker.py). Routes match in ASP.NET precedence. Several processes may
serve one listening socket (Host's http_workers).

As the real host (Azure/azure-functions-host and its Python worker) does:
- the body reaches the function only when Content-Length > 0: a chunked body arrives empty
  (without a Content-Length header, so an upload rule that asks for one answers 411);
- a wrong method on a route is 404 with no body, not 405;
- a route whose authLevel is not anonymous answers 401 (no body) without a function key
  (x-functions-key header or `code` query parameter) equal to the DEVHOST_FUNCTION_KEY setting;
- request bodies over 100 MiB are refused (413) before they are read.
Beyond the real host: only the configured host names are served (421 otherwise: DNS rebinding
against a control plane on loopback), and the body is read only when the function asks for it
(a request refused by its authentication, a route or a method costs no memory for its body;
the real host reads it, up to 100 MiB, before the function runs).
"""

from __future__ import annotations

import functools
import hmac
import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tensorant_devhost.functions import FunctionInfo
from tensorant_devhost.invocation import Invoker
from tensorant_devhost.logger import log

# HTTP serving limits: requests wait for the worker's pool on at most HTTP_THREADS threads (more than
# the pool: the pool is the limit, as on Azure); connections beyond them wait in the listen backlog
# (http.server's was 5) instead of being reset.
HTTP_THREADS = 48
HTTP_BACKLOG = 1024
HTTP_CONNECTION_LIMIT = 256
HTTP_IDLE_TIMEOUT_S = 120  # an idle keep-alive connection is closed after this
MAX_REQUEST_BODY = 100 * 1024 * 1024  # the Functions host's limit (maxRequestBodySize): 413 above it

# Host header names always served (loopback); Host.allowed_hosts and the bound address add others.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_HOST_HEADER = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>\d{1,5}))?$")
FUNCTION_KEY_SETTING = "DEVHOST_FUNCTION_KEY"


class HttpTriggers(Invoker):
    bind: str
    port: int
    cors: str | None  # CORS allowed origins, comma-separated ("*": any)
    credentials_first: bool
    allowed_hosts: tuple[str, ...]  # host names served besides loopback's and the bound address
    _routes: list[FunctionInfo]  # the HTTP functions in ASP.NET precedence

    def handle_http(
        self, method: str, raw_path: str, headers: dict[str, str], body: bytes | Callable[[], bytes]
    ) -> tuple[int, dict[str, str], bytes]:
        """Route one request to its function; return (status, headers, body). `body` may be a reader,
        called only when the function reads the body: a request to no route, a refused method or
        host, or one its function refuses before reading, is answered without reading what it sent."""
        refused = self._refuse_host(_header(headers, "Host"))
        if refused is not None:
            return refused
        split = urlsplit(raw_path)
        prefix = "/" + self.config.route_prefix if self.config.route_prefix else ""
        path = split.path
        if path == "/" and prefix and method in ("GET", "HEAD"):
            # The bare host URL: the console. (A function cannot be routed at "/" under routePrefix "api";
            # the real host shows its default page there: docs/console.md, "The console at /".)
            return 302, {"Location": f"{prefix}/console", "Cache-Control": "no-store"}, b""
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
                query = dict(parse_qsl(split.query))
                if not self._key_ok(f, headers, query):
                    return 401, {}, b""  # as the real host: no body
                return self._call_http(f, method, split, headers, body, params)
        if matched:
            return 404, {}, b""  # a wrong method: the real host answers as for no route, without a body
        return _problem(404, "Not Found", f"no function serves {method} {path}")

    def _refuse_host(self, host: str | None) -> tuple[int, dict[str, str], bytes] | None:
        """None when the Host header names this host; else the answer: 400 when it is not a host name
        (a path in it, as in `Host: h/api/platform/`), 421 when it names another host."""
        if host is None:
            return None  # HTTP/1.0 without Host: nothing rebound, the URL uses localhost
        m = _HOST_HEADER.match(host.strip())
        if not m:
            return _problem(400, "Bad Request", f"the Host header {host!r} is not a host name with an optional port")
        name = (m.group("v6") or m.group("name") or "").lower().rstrip(".")
        if name in self._served_names():
            return None
        return _problem(421, "Misdirected Request",
                        f"this dev host serves {', '.join(sorted(self._served_names()))}, not {name!r} (a name "
                        "that is not its own may be a web page rebound to this machine by DNS); to serve another "
                        "name, start the host with allowed_hosts or set it in TENSORANT_PUBLIC_URL")

    def _served_names(self) -> set[str]:
        names = set(LOOPBACK_NAMES) | {h.lower().strip("[]").rstrip(".") for h in self.allowed_hosts}
        if self.bind not in ("", "0.0.0.0", "::"):
            names.add(self.bind.lower().strip("[]"))
        public = urlsplit(os.environ.get("TENSORANT_PUBLIC_URL", "")).hostname
        if public:
            names.add(public.lower().rstrip("."))
        return names

    def _key_ok(self, f: FunctionInfo, headers: dict[str, str], query: dict[str, str]) -> bool:
        """authLevel as the real host checks it: anonymous needs nothing; function and admin need a
        key (here one key, the DEVHOST_FUNCTION_KEY app setting, stands for the function and master keys)."""
        if f.auth_level == "anonymous":
            return True
        expected = os.environ.get(FUNCTION_KEY_SETTING, "")
        given = _header(headers, "x-functions-key") or query.get("code") or ""
        return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())

    def _call_http(self, f: FunctionInfo, method: str, split: Any, headers: dict[str, str],
                   body: bytes | Callable[[], bytes], params: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        host = _header(headers, "Host") or f"localhost:{self.port}"
        url = f"http://{host}{split.path}" + (f"?{split.query}" if split.query else "")
        req = _request(method=method, url=url, headers=headers, params=dict(parse_qsl(split.query)),
                       route_params=params, body=body)
        try:
            resp = self.invoke(f, req, f"{method} {split.path}")
        except Exception as exc:
            return _problem(500, "Internal Server Error", f"function {f.name} failed: {type(exc).__name__}")
        import azure.functions as func

        if resp is None:
            return 204, {}, b""
        if isinstance(resp, str | bytes):
            resp = func.HttpResponse(resp)
        out = {k: v for k, v in resp.headers.items()}
        if not any(k.lower() == "content-type" for k in out):
            text_like = resp.mimetype.startswith("text/") or resp.mimetype.endswith("json")
            out["Content-Type"] = f"{resp.mimetype}; charset={resp.charset}" if text_like else resp.mimetype
        return int(resp.status_code), out, resp.get_body()


def _header(headers: dict[str, str], name: str) -> str | None:
    lower = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lower), None)


def _request(*, body: bytes | Callable[[], bytes], **fields: Any) -> Any:
    """A func.HttpRequest whose body is read on the first get_body() (a reader), or given (bytes)."""
    import azure.functions as func

    if not callable(body):
        return func.HttpRequest(body=body, **fields)
    req = _lazy_request_class()(body=b"", **fields)
    req._reader = body
    return req


@functools.cache
def _lazy_request_class() -> type:
    import azure.functions as func

    class LazyBodyRequest(func.HttpRequest):
        _reader: Callable[[], bytes]
        _read: bytes | None = None

        def get_body(self) -> bytes:
            if self._read is None:
                self._read = self._reader()
            return self._read

    return LazyBodyRequest


def _problem(status: int, title: str, detail: str) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail}).encode()
    return status, {"Content-Type": "application/problem+json"}, body


def listen_socket(bind: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind, port))
    sock.listen(HTTP_BACKLOG)
    sock.setblocking(False)
    return sock


def fork_http_worker(host: HttpTriggers, sock: socket.socket) -> int:
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
        host._worker = None  # this process's own worker (a parent's pool threads are not forked)
        serve(host, sock).run()
    finally:
        os._exit(0)  # never return into the parent's code


def serve(host: HttpTriggers, sock: socket.socket | None = None) -> Any:
    """A waitress server bound to host's address (or serving a listening socket), not yet running
    (run() serves until shutdown)."""
    from waitress.server import create_server

    where: dict[str, Any] = {"sockets": [sock]} if sock is not None else {"host": host.bind, "port": host.port}
    server = create_server(
        functools.partial(_wsgi, host), **where, threads=HTTP_THREADS,
        backlog=HTTP_BACKLOG, connection_limit=HTTP_CONNECTION_LIMIT, channel_timeout=HTTP_IDLE_TIMEOUT_S,
        max_request_body_size=MAX_REQUEST_BODY, ident="tensorant-devhost/2", clear_untrusted_proxy_headers=True,
        expose_tracebacks=False,
    )
    server.channel_class = _channel_class()
    return server


@functools.cache
def _channel_class() -> type:
    """waitress's connection, telling the app that a request came chunked (waitress de-chunks the body,
    then drops Transfer-Encoding and sets Content-Length, as if the client had sent one)."""
    from waitress.channel import HTTPChannel
    from waitress.parser import HTTPRequestParser

    class Parser(HTTPRequestParser):  # type: ignore[misc]
        def parse_header(self, header_plus: bytes) -> None:
            super().parse_header(header_plus)
            if self.chunked:
                self.headers["TRANSFER_ENCODING"] = "chunked"  # read back by _request_headers

    class Channel(HTTPChannel):  # type: ignore[misc]
        parser_class = Parser

    return Channel


def shutdown_server(server: Any) -> None:
    """Stop a waitress server started by serve: close the listener and every connection (its
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


def _wsgi(host: HttpTriggers, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """One request: the same routing and invocation as before, behind WSGI."""
    method = str(environ["REQUEST_METHOD"]).upper()
    # REQUEST_URI is the path as sent (PATH_INFO is decoded): routes match the raw path, as before.
    raw_path = str(environ.get("REQUEST_URI") or environ.get("PATH_INFO") or "/")
    headers = _request_headers(environ)
    # waitress validated the length (and de-chunked a chunked body, counting it); the real host forwards
    # the body only when the client sent Content-Length > 0, so a chunked one arrives empty.
    length = int(headers.get("Content-Length") or 0)

    def body() -> bytes:
        # Read only when the function reads it; with credentials_first, only from a caller that sent
        # an Authorization header (the app's routes authenticate before they parse).
        if not length or (host.credentials_first and "Authorization" not in headers):
            return b""
        return bytes(environ["wsgi.input"].read(length))

    if (method == "OPTIONS" and host.cors and "Access-Control-Request-Method" in headers
            and host._refuse_host(headers.get("Host")) is None):
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
