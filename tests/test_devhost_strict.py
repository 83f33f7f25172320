"""The dev host does what the real Azure Functions host does where a plain server would not
(LESSONS.md, "The real Azure Functions host"): functionTimeout restarts the worker, one pool of
min(32, cpu+4) threads for every trigger, batchSize + newBatchThreshold per queue, the 10-minute
lease renewed at half, past-due timers after a restart, authLevel, chunked bodies dropped; and the
HTTP edge's own rules: only local host names, the admin route decided by the path, bodies read
only when a function reads them, at most 100 MiB."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from tensorant_devhost import Host, HostConfig
from tests.azurite import Azurite
from tests.devhost_app import app as sample
from tests.test_devhost import _wait_for

SPEC = "tests.devhost_app.app:app"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """host.json with a retry at once (visibilityTimeout 0), a queue of this test's own; stuck
    functions released at the end (their abandoned threads end)."""
    monkeypatch.setenv("AzureWebJobsStorage", azurite.connection_string)
    monkeypatch.setenv("DEVHOST_QUEUE", "strict-" + secrets.token_hex(4))
    monkeypatch.setenv("DEVHOST_TIMER", "0 0 0 1 1 *")
    monkeypatch.delenv("TENSORANT_PUBLIC_URL", raising=False)
    (tmp_path / "host.json").write_text(json.dumps({"version": "2.0", "extensions": {"queues": {
        "batchSize": 4, "newBatchThreshold": 2, "maxDequeueCount": 3, "visibilityTimeout": "00:00:00",
        "maxPollingInterval": "00:00:00.200"}}}))
    sample.reset()
    yield tmp_path
    sample.reset()


def _queue(name: str) -> Any:
    from azure.storage.queue import QueueClient

    client = QueueClient.from_connection_string(os.environ["AzureWebJobsStorage"], name)
    try:
        client.create_queue()
    except Exception:
        pass
    return client


def _send(text: str) -> None:
    _queue(os.environ["DEVHOST_QUEUE"]).send_message(base64.b64encode(text.encode()).decode())


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def devhost_log() -> Iterator[_Records]:
    records = _Records()
    logger = logging.getLogger("tensorant.devhost")
    logger.addHandler(records)
    yield records
    logger.removeHandler(records)


def _config(root: Path, **changes: Any) -> HostConfig:
    from dataclasses import replace

    return replace(HostConfig.load(root), **changes)


# ---------------------------------------------------------------- functionTimeout and the worker


def test_a_timeout_restarts_the_worker_failing_its_other_invocations(root: Path, devhost_log: _Records) -> None:
    """The real host restarts the language worker on a timeout: the culprit's HTTP request is 500,
    a queue message running beside it fails too and goes back for a retry (its dequeue count
    counts), and what comes next runs on a fresh pool although the old threads are still stuck."""
    queue = os.environ["DEVHOST_QUEUE"]
    config = _config(root, function_timeout_s=2.0, worker_threads=2)
    with Host(SPEC, root=root, port=0, queues=False, timers=False, config=config) as host:
        answers: dict[str, requests.Response] = {}
        stuck = threading.Thread(target=lambda: answers.setdefault("hang", requests.get(f"{host.url}/api/hang",
                                                                                          timeout=30)))
        stuck.start()
        assert _wait_for(lambda: ("hang", None) in sample.CALLS)
        _send("hang-in-the-queue")  # starts 1 s later: it would time out only at 3 s
        time.sleep(1.0)  # real time: the timeout is the host's real clock, as on Azure
        pumped = threading.Thread(target=host.pump)
        pumped.start()
        stuck.join(30)
        pumped.join(30)
        assert not stuck.is_alive() and not pumped.is_alive()

        r = answers["hang"]
        assert r.status_code == 500 and r.json()["detail"] == "function hang failed: FunctionTimeout"
        assert any("Timeout value of 00:00:02 exceeded by function 'Functions.hang'" in line
                   for line in devhost_log.lines), devhost_log.lines
        assert any("'Functions.work' (Failed" in line and "WorkerRestarted" in line for line in devhost_log.lines)
        [msg] = _queue(queue).peek_messages(max_messages=5)  # released for a retry, not deleted
        assert msg.dequeue_count == 1 and base64.b64decode(msg.content) == b"hang-in-the-queue"

        # Both old threads still hang; the fresh worker answers at once.
        start = time.monotonic()
        assert requests.get(f"{host.url}/api/items/3", timeout=5).status_code == 200
        assert time.monotonic() - start < 1.0


def test_one_pool_for_every_trigger_and_waiting_counts_toward_the_timeout(root: Path) -> None:
    """A queue message waits for the thread an HTTP request holds (one pool, as in the Python
    worker); it never starts, and the restart fails it: the wait was part of its time."""
    config = _config(root, function_timeout_s=1.0, worker_threads=1)
    with Host(SPEC, root=root, port=0, queues=False, timers=False, config=config) as host:
        stuck = threading.Thread(target=lambda: requests.get(f"{host.url}/api/hang", timeout=30))
        stuck.start()
        assert _wait_for(lambda: ("hang", None) in sample.CALLS)
        _send("hello")
        assert host.pump() == 1
        stuck.join(30)
    assert [name for name, _ in sample.CALLS] == ["hang"]  # "hello" never ran: no thread was free
    [msg] = _queue(os.environ["DEVHOST_QUEUE"]).peek_messages(max_messages=5)
    assert msg.dequeue_count == 1  # released for a retry


def test_the_worker_pool_is_the_python_workers() -> None:
    from tensorant_devhost.worker import default_threads

    assert default_threads() == min(32, (os.cpu_count() or 1) + 4)
    config = HostConfig.load(ROOT)
    assert (config.function_timeout_s, config.worker_threads) == (300.0, 0)  # host.json's 5 minutes, enforced


def test_a_queue_function_has_batch_size_plus_new_batch_threshold_in_flight(root: Path) -> None:
    """batchSize 4 + newBatchThreshold 2: six at once (the old host ran four), and no seventh while
    more than two are busy."""
    for text in ("sleep:0.1", "sleep:0.1", "hang-1", "hang-2", *[f"hang-{i}" for i in range(3, 9)]):
        _send(text)
    with Host(SPEC, root=root, http=False, timers=False, config=_config(root, worker_threads=32)):
        assert _wait_for(lambda: sample.MAX_CONCURRENT == 6, timeout=10), sample.MAX_CONCURRENT
        time.sleep(0.5)  # the poller checks every 50 ms: a seventh would have been taken by now
        assert sample.MAX_CONCURRENT == 6
        sample.RELEASE.set()  # so stop() does not wait for them


# ---------------------------------------------------------------- the queue lease


def test_a_running_message_is_leased_ten_minutes_renewed_at_half(root: Path) -> None:
    from tensorant_devhost.queues import _Lease

    assert HostConfig().processing_lease_s == 600 == HostConfig.load(ROOT).processing_lease_s

    host = Host(SPEC, root=root, http=False, timers=False)
    [f] = host.by_kind("queue")
    _send("x")
    [msg] = host._receive(f, 1)
    left = (msg.next_visible_on - datetime.now(UTC)).total_seconds()
    assert 540 < left <= 601, left  # received with the 10-minute lease

    class Client:
        renewed: list[float] = []

        def update_message(self, *args: Any, visibility_timeout: int) -> Any:
            self.renewed.append(time.monotonic())
            return type("Receipt", (), {"pop_receipt": "r"})()

    start = time.monotonic()
    lease = _Lease(Client(), type("Msg", (), {"id": "m", "pop_receipt": "r0"})(), 2)
    assert _wait_for(lambda: len(Client.renewed) == 1, timeout=3)
    lease.end()
    assert 0.9 <= Client.renewed[0] - start < 1.6  # at half of the lease (it was a third)


# ---------------------------------------------------------------- timers


def _timer(host: Host, name: str) -> Any:
    return next(f for f in host.functions if f.name == name)


def test_a_missed_timer_runs_once_past_due_after_a_restart(root: Path) -> None:
    """useMonitor: the host records each timer's next occurrence; one that passed while no host ran
    runs once at start, past due, then the schedule goes on."""
    host = Host(SPEC, root=root, http=False, queues=False)
    tick = _timer(host, "tick")
    assert host._timer_start(tick)[1] is False  # a first start: nothing recorded, nothing past due
    status = json.loads(host._status_path(tick).read_text())
    assert datetime.fromisoformat(status["Next"]) > datetime.now(UTC)

    # As if the host had been down over the occurrence it recorded.
    status["Next"] = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    host._status_path(tick).write_text(json.dumps(status))
    with Host(SPEC, root=root, http=False, queues=False):
        assert _wait_for(lambda: ("tick", True) in sample.CALLS)
    assert [v for name, v in sample.CALLS if name == "tick"] == [True]
    after = json.loads(host._status_path(tick).read_text())
    assert datetime.fromisoformat(after["Next"]) > datetime.now(UTC)  # recorded: the next start runs nothing
    assert host._timer_start(tick)[1] is False


def test_a_changed_schedule_starts_over_without_a_past_due_run(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(SPEC, root=root, http=False, queues=False)
    tick = _timer(host, "tick")
    host._save_status(tick, None, datetime.now(UTC) - timedelta(hours=1))
    monkeypatch.setenv("DEVHOST_TIMER", "0 0 3 * * *")
    assert host._timer_start(tick)[1] is False


# ---------------------------------------------------------------- authLevel


def test_a_route_without_anonymous_needs_a_function_key(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Blueprint route without auth_level, in an app built as function_app.py builds it, compiles to
    FUNCTION: 401 on Azure without a key."""
    import azure.functions as func

    bp = func.Blueprint()

    @bp.route(route="keyed", methods=["GET"])
    def keyed(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("in")

    app = func.FunctionApp()
    app.register_functions(bp)
    monkeypatch.setenv("DEVHOST_FUNCTION_KEY", "k-" + secrets.token_hex(8))
    with Host(app, root=root, port=0, queues=False, timers=False) as host:
        r = requests.get(f"{host.url}/api/keyed", timeout=5)
        assert (r.status_code, r.content) == (401, b"")
        assert requests.get(f"{host.url}/api/keyed", headers={"x-functions-key": "wrong"}, timeout=5).status_code == 401
        key = os.environ["DEVHOST_FUNCTION_KEY"]
        assert requests.get(f"{host.url}/api/keyed", headers={"x-functions-key": key}, timeout=5).text == "in"
        assert requests.get(f"{host.url}/api/keyed?code={key}", timeout=5).text == "in"


def test_every_route_of_the_app_is_registered_anonymous_on_purpose(env: dict[str, str]) -> None:
    """The app authenticates every request itself (JWTs, run tokens): a route that forgets
    auth_level=ANONYMOUS would answer 401 to every client on Azure, and pass locally without this."""
    import function_app
    from tensorant_devhost.functions import describe_functions

    routes = [f for f in describe_functions(function_app.app) if f.kind == "http"]
    assert len(routes) > 20
    keyed = [f"{f.name} ({f.route.template if f.route else ''}): {f.auth_level}" for f in routes
             if f.auth_level != "anonymous"]
    assert not keyed, "routes without auth_level=func.AuthLevel.ANONYMOUS: " + ", ".join(keyed)


# ---------------------------------------------------------------- bodies


@pytest.fixture
def app_host(env: dict[str, str]) -> Iterator[Host]:
    """The real function app in the dev host, as `make run` serves it."""
    import function_app

    host = Host(function_app.app, root=ROOT, port=0, load_settings=False, queues=False, timers=False,
                credentials_first=True).start()
    yield host
    host.stop()


def _owner() -> dict[str, str]:
    from shared.models import Role
    from shared.security import mint_user_token

    return {"Authorization": f"Bearer {mint_user_token('owner@a', 'org-a', Role.owner)}"}


def test_a_chunked_body_arrives_empty_and_an_upload_without_a_length_is_411(app_host: Host) -> None:
    """The real host forwards a body only with Content-Length > 0."""
    def chunks(*parts: bytes) -> Iterator[bytes]:
        yield from parts

    r = requests.post(f"{app_host.url}/api/projects", data=chunks(b'{"name": ', b'"p"}'), timeout=10,
                      headers={**_owner(), "Content-Type": "application/json"})
    assert r.status_code == 422 and "name" in json.dumps(r.json()["errors"]), r.text  # as through the real worker
    r = requests.post(f"{app_host.url}/api/projects/p-1/datasets", data=chunks(b'{"messages": []}\n'), timeout=10,
                      headers={**_owner(), "Content-Type": "application/x-ndjson"})
    assert r.status_code == 411 and "Content-Length" in r.json()["detail"], r.text


def test_a_body_with_a_bogus_token_is_refused_without_being_read(app_host: Host) -> None:
    from tensorant_devhost.serving import _wsgi

    class Unread(io.RawIOBase):
        def read(self, n: int | None = -1) -> bytes:
            raise AssertionError("the body of a request with a bogus token was read")

    answered: list[str] = []
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/api/projects/p-1/datasets", "HTTP_HOST": "localhost",
               "HTTP_AUTHORIZATION": "Bearer not-a-token", "CONTENT_LENGTH": str(90 * 2**20),
               "CONTENT_TYPE": "application/x-ndjson", "wsgi.input": Unread()}
    _wsgi(app_host, environ, lambda status, headers: answered.append(status))
    assert answered and answered[0].startswith("401")


def test_a_body_over_the_hosts_100_mib_is_413_before_it_is_sent(root: Path) -> None:
    import socket

    with Host(SPEC, root=root, port=0, queues=False, timers=False) as host, \
            socket.create_connection(("127.0.0.1", host.port), timeout=5) as sock:
        sock.sendall(b"POST /api/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % (300 * 2**20))
        assert sock.recv(65536).startswith(b"HTTP/1.1 413")  # before: the host waited for 300 MiB


# ---------------------------------------------------------------- the Host header


@pytest.mark.parametrize(("host_header", "status"), [
    ("localhost:7071", 200), ("127.0.0.1", 200), ("[::1]:7071", 200), ("LOCALHOST.", 200),
    ("evil.example", 421), ("evil.example:7071", 421), ("127.0.0.1.nip.io", 421),
    ("h/api/platform/", 400), ("localhost@evil", 400),
])
def test_only_the_configured_host_names_are_served(root: Path, host_header: str, status: int) -> None:
    """DNS rebinding: a page on evil.example rebound to 127.0.0.1 sends `Host: evil.example`."""
    with Host(SPEC, root=root, port=0, queues=False, timers=False) as host:
        r = requests.get(f"{host.url}/api/items/1", headers={"Host": host_header}, timeout=5)
        assert r.status_code == status, r.text
        if status == 421:
            assert "DNS" in r.json()["detail"]


def test_a_configured_host_name_is_served(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", "http://gateway.test:7071")
    with Host(SPEC, root=root, port=0, queues=False, timers=False, allowed_hosts=("devbox.lan",)) as host:
        for name in ("gateway.test", "devbox.lan:7071"):
            assert requests.get(f"{host.url}/api/items/1", headers={"Host": name}, timeout=5).status_code == 200


def test_a_platform_admin_token_is_refused_whatever_the_host_header_says(app_host: Host) -> None:
    import azure.functions as func

    from shared import http
    from shared.context import invocation
    from shared.errors import Forbidden
    from shared.models import Role
    from shared.security import mint_user_token

    admin = {"Authorization": f"Bearer {mint_user_token('admin@platform', 'platform', Role.admin)}"}
    for hostile in ("h/api/platform/", "h/api/platform/x", "localhost/api/platform/"):
        r = requests.get(f"{app_host.url}/api/runs", headers={**admin, "Host": hostile}, timeout=5)
        assert r.status_code == 400, (hostile, r.status_code, r.text)
        # And the app itself decides by the path, whatever host builds its URL.
        req = func.HttpRequest("GET", f"http://{hostile}/api/runs", headers={**admin, "Host": hostile}, body=b"")
        assert http.request_path(req) == "/api/runs"
        with pytest.raises(Forbidden):
            http.principal(invocation(), req)
    req = func.HttpRequest("GET", "http://localhost:7071/api/platform/queues", headers={**admin, "Host": "localhost:7071"},
                           body=b"")
    assert http.principal(invocation(), req).role == Role.admin  # its own routes still work


# ---------------------------------------------------------------- poison messages


def test_an_unreadable_poison_message_is_replayed_as_it_was(env: dict[str, str]) -> None:
    from shared.queues import Queue, get_queues
    from tests.harness import Harness

    h = Harness()
    try:
        get_queues().client(Queue.release.poison).send_message("not base64 !")
        h.ok("POST", "/api/platform/queues/release/poison/replay", token="admin", json_body={})
        [msg] = get_queues().client(Queue.release.value).peek_messages(max_messages=5)
        assert msg.content == "not base64 !"  # not base64 of {"unreadable": "not base64 !"}
    finally:
        h.close()
