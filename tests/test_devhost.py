"""The local Functions host against the session Azurite, with the sample app in tests/devhost_app."""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests

from tensorant_devhost import Host, HostConfig
from tensorant_devhost.config import timespan_s
from tensorant_devhost.routes import RouteTemplate
from tensorant_devhost.timers import next_fire
from tests.azurite import Azurite
from tests.devhost_app import app as sample

SPEC = "tests.devhost_app.app:app"


def _wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture
def root(azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder with host.json, a unique queue for this test, and a clean call record."""
    monkeypatch.setenv("AzureWebJobsStorage", azurite.connection_string)
    monkeypatch.setenv("DEVHOST_QUEUE", "devhost-" + secrets.token_hex(4))
    monkeypatch.setenv("DEVHOST_TIMER", "0 0 0 1 1 *")
    (tmp_path / "host.json").write_text(json.dumps({
        "version": "2.0",
        "extensions": {"queues": {"batchSize": 4, "maxDequeueCount": 3, "visibilityTimeout": "00:00:00",
                                  "maxPollingInterval": "00:00:00.200", "messageEncoding": "base64"}},
    }))
    sample.reset()
    yield tmp_path


def _queue(name: str) -> object:
    import os

    from azure.storage.queue import QueueClient

    return QueueClient.from_connection_string(os.environ["AzureWebJobsStorage"], name)


def _send(text: str) -> None:
    import os

    q = _queue(os.environ["DEVHOST_QUEUE"])
    try:
        q.create_queue()  # type: ignore[attr-defined]
    except Exception:
        pass
    q.send_message(base64.b64encode(text.encode()).decode())  # type: ignore[attr-defined]


def _visible(name: str) -> list[str]:
    from azure.core.exceptions import ResourceNotFoundError

    try:
        return [m.content for m in _queue(name).peek_messages(max_messages=32)]  # type: ignore[attr-defined]
    except ResourceNotFoundError:
        return []


# ---------------------------------------------------------------- pure parts


def test_host_json_settings_and_defaults() -> None:
    cfg = HostConfig.from_host_json({"extensions": {"queues": {
        "batchSize": 8, "maxDequeueCount": 4, "visibilityTimeout": "00:00:30", "maxPollingInterval": "00:00:02",
        "messageEncoding": "base64"}}})
    assert (cfg.batch_size, cfg.new_batch_threshold, cfg.max_dequeue_count) == (8, 4, 4)
    assert (cfg.visibility_timeout_s, cfg.max_polling_interval_s, cfg.message_encoding) == (30.0, 2.0, "base64")
    default = HostConfig.from_host_json({"version": "2.0"})
    assert (default.batch_size, default.max_dequeue_count, default.route_prefix) == (16, 5, "api")
    assert timespan_s("1.00:00:01", 0) == 86401 and timespan_s(1500, 0) == 1.5
    with pytest.raises(ValueError):
        HostConfig.from_host_json({"extensions": {"queues": {"batchSize": 64}}})


def test_route_templates_constraints_and_precedence() -> None:
    assert RouteTemplate("runs/{id}").match("runs/r-1") == {"id": "r-1"}
    assert RouteTemplate("runs/{id}").match("runs/r-1/logs") is None
    assert RouteTemplate("items/{id:int}").match("items/abc") is None
    assert RouteTemplate("items/{id:int:min(2)}").match("items/1") is None
    assert RouteTemplate("files/{*rest}").match("files/a/b.txt") == {"rest": "a/b.txt"}
    assert RouteTemplate("runs/{id?}").match("runs") == {}
    assert RouteTemplate("Admin/Queues").match("admin/queues") == {}
    literal, param = RouteTemplate("runs/stats"), RouteTemplate("runs/{id}")
    assert sorted([param, literal], key=lambda r: r.precedence)[0] is literal


def test_ncrontab_has_seconds_first() -> None:
    t0 = datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert next_fire("0 */5 * * * *", t0) == datetime(2026, 1, 1, 0, 5, 0, tzinfo=UTC)
    assert next_fire("*/10 * * * * *", t0) == datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    assert next_fire("00:00:30", t0) == datetime(2026, 1, 1, 0, 0, 31, tzinfo=UTC)
    with pytest.raises(ValueError):
        next_fire("* * *", t0)


# ---------------------------------------------------------------- http


def test_http_routes_params_methods_and_problem_404(root: Path) -> None:
    with Host(SPEC, root=root, port=0, queues=False, timers=False) as host:
        r = requests.get(f"{host.url}/api/items/42?q=x", headers={"Authorization": "Bearer t"}, timeout=5)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
        assert r.json() == {"id": 42, "q": "x", "url": f"{host.url}/api/items/42?q=x", "auth": "Bearer t"}
        assert requests.get(f"{host.url}/api/items/special", timeout=5).text == "special"

        r = requests.post(f"{host.url}/api/echo", data=b"\x00raw", headers={"Content-Type": "application/x-ndjson"},
                          timeout=5)
        assert (r.status_code, r.content, r.headers["X-Echo-Method"]) == (201, b"\x00raw", "POST")
        assert r.headers["Content-Type"].startswith("application/x-ndjson")
        r = requests.put(f"{host.url}/api/echo", data=iter([b"chunk1", b"chunk2"]), timeout=5)  # chunked upload
        assert r.content == b""  # as the real host: a body is forwarded only with a Content-Length

        for path in ("/api/items/abc", "/api/nothing/here", "/elsewhere"):
            r = requests.get(host.url + path, timeout=5)
            assert r.status_code == 404, path
            assert r.headers["Content-Type"] == "application/problem+json"
            assert r.json()["title"] == "Not Found" and r.json()["status"] == 404

        r = requests.delete(f"{host.url}/api/items/1", timeout=5)
        assert (r.status_code, r.content) == (404, b"")  # as the real host: not 405, no body

        r = requests.get(f"{host.url}/api/boom", timeout=5)
        assert r.status_code == 500 and r.json()["detail"] == "function boom failed: RuntimeError"


def test_the_bare_host_url_redirects_to_the_console(root: Path) -> None:
    """`/` is no function's route under routePrefix "api": the dev host sends it to the console."""
    with Host(SPEC, root=root, port=0, queues=False, timers=False) as host:
        r = requests.get(f"{host.url}/", allow_redirects=False, timeout=5)
        assert (r.status_code, r.headers["Location"]) == (302, "/api/console")
        assert requests.post(f"{host.url}/", timeout=5).status_code == 404  # only a page visit is sent on


def test_local_settings_values_loaded_without_overriding(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVHOST_PRESET", "from-env")
    monkeypatch.delenv("DEVHOST_FROM_FILE", raising=False)
    (root / "local.settings.json").write_text(json.dumps({
        "IsEncrypted": False,
        "Values": {"DEVHOST_FROM_FILE": "from-file", "DEVHOST_PRESET": "from-file"},
        "Host": {"CORS": "*"},
    }))
    try:
        with Host(SPEC, root=root, port=0, queues=False, timers=False) as host:
            assert requests.get(f"{host.url}/api/settings/DEVHOST_FROM_FILE", timeout=5).text == "from-file"
            assert requests.get(f"{host.url}/api/settings/DEVHOST_PRESET", timeout=5).text == "from-env"
            r = requests.get(f"{host.url}/api/items/1", headers={"Origin": "http://localhost:5173"}, timeout=5)
            assert r.headers["Access-Control-Allow-Origin"] == "*"
    finally:
        monkeypatch.delenv("DEVHOST_FROM_FILE", raising=False)


# ---------------------------------------------------------------- queues


def test_queue_message_processed_once_and_deleted(root: Path) -> None:
    import os

    host = Host(SPEC, root=root, http=False, timers=False)
    _send("hello")
    assert host.pump() == 1
    assert sample.CALLS == [("work", ("hello", 1))]
    assert _visible(os.environ["DEVHOST_QUEUE"]) == []
    assert host.pump() == 0
    assert len(sample.CALLS) == 1


def test_failing_message_moves_to_poison_with_original_text(root: Path) -> None:
    import os

    queue = os.environ["DEVHOST_QUEUE"]
    host = Host(SPEC, root=root, http=False, timers=False)
    _send('{"poison": true}')
    original = _visible(queue)
    assert host.pump() == 1 and _visible(queue) == original  # failed, released (visibilityTimeout 0)
    assert host.pump() == 1 and _visible(queue) == original
    assert _visible(queue + "-poison") == []
    assert host.pump() == 1  # third failure = maxDequeueCount
    assert _visible(queue) == []
    assert _visible(queue + "-poison") == original
    assert base64.b64decode(original[0]).decode() == '{"poison": true}'
    assert [v[1] for _, v in sample.CALLS] == [1, 2, 3]  # type: ignore[index]


def test_pollers_run_a_batch_concurrently_and_poll_again(root: Path) -> None:
    import os

    with Host(SPEC, root=root, http=False, timers=False):
        for i in range(4):
            _send(f"slow-{i}")
        assert _wait_for(lambda: len(sample.CALLS) == 4)
        assert sample.MAX_CONCURRENT >= 2  # batchSize 4: handled side by side, not one by one
        _send("later")  # after going idle the poller backs off to at most 0.2 s
        assert _wait_for(lambda: len(sample.CALLS) == 5, timeout=3)
        assert _wait_for(lambda: _visible(os.environ["DEVHOST_QUEUE"]) == [])


def test_undecodable_message_is_poisoned_at_once_raw(root: Path) -> None:
    import os

    queue = os.environ["DEVHOST_QUEUE"]
    host = Host(SPEC, root=root, http=False, timers=False)
    q = _queue(queue)
    try:
        q.create_queue()  # type: ignore[attr-defined]
    except Exception:
        pass
    q.send_message("not base64 !")  # type: ignore[attr-defined]
    assert host.pump() == 1  # one delivery: no retry can decode it (the real host poisons it at once)
    assert sample.CALLS == []
    assert _visible(queue) == []
    assert _visible(queue + "-poison") == ["not base64 !"]  # raw, as it was sent


# ---------------------------------------------------------------- timers


def test_timer_fires_on_schedule_and_run_on_startup(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVHOST_TIMER", "* * * * * *")  # every second
    with Host(SPEC, root=root, http=False, queues=False):
        assert _wait_for(lambda: any(name == "startup_tick" for name, _ in sample.CALLS), timeout=1)
        assert _wait_for(lambda: any(name == "tick" for name, _ in sample.CALLS), timeout=2.5)
    ticks = [v for name, v in sample.CALLS if name == "tick"]
    assert ticks and ticks[0] is False  # not past due
    assert [name for name, _ in sample.CALLS].count("startup_tick") == 1  # yearly schedule: startup only


def test_routes_under_admin_are_refused_like_the_real_host(root: Path) -> None:
    import azure.functions as func

    app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)

    @app.route(route="admin/queues")
    def queues(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("")

    with pytest.raises(ValueError, match="reserves"):
        Host(app, root=root, port=0)


def test_output_binding_and_async_function(root: Path) -> None:
    """A queue output binding is sent base64-encoded; an async HTTP function is awaited."""
    import os

    import azure.functions as func

    out_queue = os.environ["DEVHOST_QUEUE"]
    app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)

    @app.route(route="send/{text}", methods=["POST"])
    @app.queue_output(arg_name="out", queue_name=out_queue, connection="AzureWebJobsStorage")
    async def send(req: func.HttpRequest, out: func.Out[str]) -> func.HttpResponse:
        out.set(req.route_params["text"])
        return func.HttpResponse("sent", status_code=202)

    with Host(app, root=root, port=0, queues=False) as host:
        assert requests.post(f"{host.url}/api/send/hi", timeout=5).status_code == 202
    assert [base64.b64decode(t).decode() for t in _visible(out_queue)] == ["hi"]


def test_make_run_reuses_an_azurite_and_refuses_a_foreign_server(azurite: Azurite, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tensorant_devhost import run

    blob, queue, table = azurite.ports
    monkeypatch.setattr(run, "AZURITE_PORTS", {"Blob": blob, "Queue": queue, "Table": table})
    assert run.ensure_azurite(tmp_path) is None  # reused, not started (and so not stopped later)
    assert not (tmp_path / ".tensorant").exists()

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, args=(0.05,), daemon=True).start()
    try:
        monkeypatch.setattr(run, "AZURITE_PORTS", {"Blob": blob, "Queue": other.server_address[1], "Table": table})
        with pytest.raises(run.RunError, match=r"not a complete Azurite"):
            run.ensure_azurite(tmp_path)
    finally:
        other.shutdown()
        other.server_close()


def test_notify_skips_the_idle_backoff(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    from typing import Any

    from tensorant_devhost.invocation import notify

    polls = threading.Semaphore(0)
    receive = Host._receive

    def counted(self: Host, f: Any, count: int) -> list[Any]:
        got = receive(self, f, count)
        polls.release()
        return got

    monkeypatch.setattr(Host, "_receive", counted)
    (root / "host.json").write_text(json.dumps({"version": "2.0", "extensions": {"queues": {
        "batchSize": 4, "maxPollingInterval": "00:00:10"}}}))
    with Host(SPEC, root=root, http=False, timers=False):
        for _ in range(4):  # idle: polls at 0, 0.2, 0.6, 1.4 s; the next one would be at 3.0 s
            assert polls.acquire(timeout=10)
        _send("wake")
        import os

        notify(os.environ["DEVHOST_QUEUE"])
        assert _wait_for(lambda: len(sample.CALLS) == 1, timeout=0.6)


# ---------------------------------------------------------------- the HTTP server


def _raw(host: Host, request: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes on a new connection; return what came back before the server closed it or timeout."""
    import socket

    with socket.create_connection(("127.0.0.1", host.port), timeout=timeout) as sock:
        sock.sendall(request)
        out = b""
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                out += data
                if b"\r\n\r\n" in out and b"Connection: close" in out.split(b"\r\n\r\n")[0]:
                    break
        except TimeoutError:
            pass
        return out


def test_thirty_simultaneous_connections_are_all_answered(root: Path) -> None:
    import socket
    import threading

    with Host(SPEC, root=root, port=0, queues=False, timers=False) as host:
        # Every client connects first (the barrier), then all send at once: with a listen
        # backlog of 5 the surplus connections were reset.
        n = 30
        barrier = threading.Barrier(n)
        answers: list[bytes | str] = [b""] * n

        def client(i: int) -> None:
            try:
                barrier.wait(timeout=10)
                with socket.create_connection(("127.0.0.1", host.port), timeout=15) as sock:
                    sock.sendall(b"GET /api/slow?s=0.3 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    data = b""
                    while chunk := sock.recv(4096):
                        data += chunk
                    answers[i] = data
            except OSError as exc:
                answers[i] = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        bad = [a for a in answers if not (isinstance(a, bytes) and a.startswith(b"HTTP/1.1 200") and a.endswith(b"done"))]
        assert not bad, bad


def test_a_204_has_no_body_and_keep_alive_goes_on(root: Path) -> None:
    import http.client

    with Host(SPEC, root=root, port=0, queues=False, timers=False) as host:
        conn = http.client.HTTPConnection("127.0.0.1", host.port, timeout=5)
        conn.request("POST", "/api/nothing", body=b"{}")
        r = conn.getresponse()
        assert r.status == 204 and r.read() == b"" and r.getheader("Content-Length") is None
        # On the same connection: a stray body would be read as this response's status line.
        conn.request("GET", "/api/items/7")
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["id"] == 7
        conn.close()
        raw = _raw(host, b"POST /api/nothing HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 204") and raw.endswith(b"\r\n\r\n"), raw


@pytest.mark.parametrize("request_bytes", [
    b"POST /api/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1\r\n\r\nabc",
    b"POST /api/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: ten\r\n\r\nabc",
    b"POST /api/echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    b"POST /api/echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n",
], ids=["negative-length", "text-length", "bad-chunk-size", "chunk-overrun"])
def test_malformed_framing_gets_a_quick_400(root: Path, request_bytes: bytes) -> None:
    with Host(SPEC, root=root, port=0, queues=False, timers=False) as host:
        start = time.monotonic()
        raw = _raw(host, request_bytes, timeout=5)
        assert raw.startswith(b"HTTP/1.1 400"), raw  # before: no answer, or a hang until the timeout
        assert time.monotonic() - start < 2.0


def test_keep_alive_requests_are_fast(root: Path) -> None:
    import http.client
    import statistics

    with Host(SPEC, root=root, port=0, queues=False, timers=False) as host:
        conn = http.client.HTTPConnection("127.0.0.1", host.port, timeout=5)
        took = []
        for _ in range(40):
            start = time.perf_counter()
            conn.request("POST", "/api/echo", body=b"x" * 200, headers={"Content-Type": "text/plain"})
            r = conn.getresponse()
            assert r.status == 201 and r.read() == b"x" * 200
            took.append(time.perf_counter() - start)
        conn.close()
        # Before: about 40 ms each (headers and body in two writes meet Nagle and the delayed ACK).
        assert statistics.median(took) < 0.02, f"median {statistics.median(took) * 1000:.1f} ms"


def test_http_worker_processes_share_one_socket_and_stop_with_the_host(root: Path) -> None:
    import os
    from concurrent.futures import ThreadPoolExecutor

    import requests

    with pytest.raises(ValueError):
        Host(SPEC, root=root, port=0, http_workers=0)
    host = Host(SPEC, root=root, port=0, queues=False, timers=False, http_workers=3).start()
    try:
        children = list(host._children)
        assert len(children) == 2

        def get(_: int) -> str:
            r = requests.get(f"{host.url}/api/pid", headers={"Connection": "close"}, timeout=10)
            assert r.status_code == 200
            return r.text

        with ThreadPoolExecutor(12) as pool:
            served = {int(p) for p in pool.map(get, range(120))}
    finally:
        host.stop()
    assert served <= {os.getpid(), *children} and len(served) >= 2, (served, children)
    for pid in children:  # reaped: no process, no zombie
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# ---------------------------------------------------------------- CORS of `make run`


def test_make_run_allows_only_its_own_local_origins(root: Path) -> None:
    from tensorant_devhost.run import RunError, cors_origins

    allowed = cors_origins(None, 7071)
    assert allowed == "http://localhost:7071,http://127.0.0.1:7071"
    assert cors_origins("https://app.example.com", 7071) == "https://app.example.com"
    with pytest.raises(RunError, match="any web page"):
        cors_origins("http://localhost:3000, *", 7071)
    with Host(SPEC, root=root, port=0, queues=False, timers=False, cors=allowed) as host:
        evil = requests.options(f"{host.url}/api/items/1", timeout=5, headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization"})
        assert "Access-Control-Allow-Origin" not in evil.headers  # the browser refuses the page's request
        own = requests.get(f"{host.url}/api/items/1", headers={"Origin": "http://localhost:7071"}, timeout=5)
        assert own.headers["Access-Control-Allow-Origin"] == "http://localhost:7071"


def test_a_request_to_no_route_is_answered_without_reading_its_body(root: Path) -> None:
    import io

    from tensorant_devhost.serving import _wsgi

    class Unread(io.RawIOBase):
        def read(self, n: int = -1) -> bytes:
            raise AssertionError("the body of a request no function serves was read")

    host = Host(SPEC, root=root, port=0, queues=False, timers=False)
    answered: list[str] = []
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/api/no/such/route", "CONTENT_LENGTH": str(300 * 2**20),
               "CONTENT_TYPE": "application/octet-stream", "wsgi.input": Unread()}
    _wsgi(host, environ, lambda status, headers: answered.append(status))
    assert answered and answered[0].startswith("404")


def test_a_chunked_request_reaches_the_function_without_a_content_length() -> None:
    from tensorant_devhost.serving import _request_headers

    # waitress de-chunks and sets CONTENT_LENGTH; the function must still see no length (its 411 rule).
    headers = _request_headers({"HTTP_TRANSFER_ENCODING": "chunked", "CONTENT_LENGTH": "5",
                                "CONTENT_TYPE": "application/zip"})
    assert "Content-Length" not in headers and headers["Transfer-Encoding"] == "chunked"
    assert _request_headers({"CONTENT_LENGTH": "5"})["Content-Length"] == "5"


def test_an_unauthenticated_upload_is_refused_without_reading_its_body(env: dict[str, str]) -> None:
    import io

    import function_app
    from tensorant_devhost.serving import _wsgi

    class Unread(io.RawIOBase):
        def read(self, n: int = -1) -> bytes:
            raise AssertionError("the body of an unauthenticated request was read")

    host = Host(function_app.app, root=Path(__file__).resolve().parents[1], port=0, queues=False, timers=False,
                load_settings=False, credentials_first=True)  # as `make run` starts it
    answered: list[str] = []
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/api/projects/p-1/datasets",
               "CONTENT_LENGTH": str(300 * 2**20), "CONTENT_TYPE": "application/x-ndjson", "wsgi.input": Unread()}
    _wsgi(host, environ, lambda status, headers: answered.append(status))
    assert answered and answered[0].startswith("401")


# ---------------------------------------------------------------- what `make run` says


def test_http_requests_are_logged_only_when_asked(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`runs watch` polls twice a second: its requests are debug lines, shown with
    TENSORANT_LOG_REQUESTS=1 (or --verbose); steps (queue messages) are always shown."""
    import logging

    from tensorant_devhost import run

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("tensorant.devhost")
    keep = Keep()
    logger.addHandler(keep)
    try:
        monkeypatch.delenv("TENSORANT_LOG_REQUESTS", raising=False)
        assert run.log_requests(False) is False
        with Host(SPEC, root=root, port=0, queues=False, timers=False) as host:
            assert requests.get(f"{host.url}/api/items/7", timeout=5).status_code == 200
            _send("step")
            assert host.pump() == 1
            assert requests.get(f"{host.url}/api/boom", timeout=5).status_code == 500
            shown = [r.getMessage() for r in records if r.levelno >= logger.getEffectiveLevel()]
            assert not any("get_item" in m for m in shown), shown
            assert any("Functions.work" in m for m in shown)  # a step
            assert any("Functions.boom" in m and "Failed" in m for m in shown)  # a failed request still shows

            monkeypatch.setenv("TENSORANT_LOG_REQUESTS", "1")
            assert run.log_requests(False) is True
            records.clear()
            assert requests.get(f"{host.url}/api/items/8", timeout=5).status_code == 200
            shown = [r.getMessage() for r in records if r.levelno >= logger.getEffectiveLevel()]
            assert any("get_item" in m and "GET /api/items/8" in m for m in shown), shown
        monkeypatch.delenv("TENSORANT_LOG_REQUESTS")
        assert run.log_requests(True) is True  # --verbose
    finally:
        logger.removeHandler(keep)
        run.log_requests(False)


def test_make_run_says_at_shutdown_which_retained_machines_it_keeps(env: dict[str, str],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A retained run's stopped agent outlives the host (for recovery): the shutdown names it and
    says how to discard it."""
    import os
    import signal
    import subprocess
    import sys

    from tensorant_devhost import run

    machines = Path(env["TENSORANT_LOCAL_ROOT"]).resolve() / "machines"
    marks = {"TENSORANT_MANAGED": "true", "TENSORANT_DEPLOYMENT_ID": env["TENSORANT_DEPLOYMENT_ID"],
             "TENSORANT_ORG": "demo", "TENSORANT_RUN_ID": "r-kept" + secrets.token_hex(3),
             "TENSORANT_LOCAL_MACHINES": str(machines)}
    # A stand-in for a retained run's agent: marked as the local provider marks it, then stopped.
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env={**os.environ, **marks}, start_new_session=True)
    try:
        os.kill(agent.pid, signal.SIGSTOP)
        assert _wait_for(lambda: Path(f"/proc/{agent.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T")
        run.say_what_is_kept()
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if marks["TENSORANT_RUN_ID"] in x)
        assert "retained" in line and "org demo" in line and "MB" in line, out
        assert "recover" in out
        assert f"tensorant runs cancel {marks['TENSORANT_RUN_ID']} --discard" in out
    finally:
        agent.kill()
        agent.wait(10)
    run.say_what_is_kept()
    assert marks["TENSORANT_RUN_ID"] not in capsys.readouterr().out  # nothing kept: nothing said of it


def test_a_running_function_keeps_its_message_and_a_crash_loses_it_only_for_a_lease(root: Path) -> None:
    import os
    import threading

    queue = os.environ["DEVHOST_QUEUE"]
    host = Host(SPEC, root=root, http=False, timers=False, config=HostConfig(processing_lease_s=1))
    [f] = host.by_kind("queue")
    # A function that runs for 2 leases: renewed, the message is never visible meanwhile (no second delivery).
    _send("sleep:2")
    [msg] = host._receive(f, 1)
    seen: list[list[str]] = []
    worker = threading.Thread(target=lambda: seen.append([host._process(f, msg)[0]]))
    worker.start()
    time.sleep(1.5)  # Azurite's clock, not ours: the first 1 s lease must really pass (no event says so)
    assert _visible(queue) == []  # past its first lease, still held
    worker.join()
    assert seen == [["done"]] and _visible(queue) == []  # deleted with the last renewal's receipt
    # A host that dies after receiving (nothing renews): the message is back after one lease, not 5 min.
    _send("after-a-crash")
    assert len(host._receive(f, 1)) == 1
    assert _visible(queue) == []
    assert _wait_for(lambda: len(_visible(queue)) == 1, timeout=5.0)  # back after its 1 s lease


def test_a_second_checkout_never_shares_the_first_ones_azurite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run PORT=7081` without AZURITE_PORT reused the first checkout's Azurite: the two hosts shared every
    run, and one's sweep failed the other's training run (issue 38.6)."""
    from tensorant_devhost import run

    assert run.azurite_port_for(7071) == 10000 and run.azurite_port_for(7081) == 10100  # its own by default
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    own = Azurite().start()  # not the session's: the claim is a row in it
    try:
        blob, queue, table = own.ports
        monkeypatch.setattr(run, "AZURITE_PORTS", {"Blob": blob, "Queue": queue, "Table": table})
        assert run.ensure_azurite(first) is None  # reused, and claimed for the first checkout
        assert run.ensure_azurite(first) is None  # the same checkout again: fine
        with pytest.raises(run.RunError, match=r"serves another checkout .*first.*PORT=7081"):
            run.ensure_azurite(second)
    finally:
        own.stop()
