"""The `tensorant` CLI against a fake API server on loopback.

The fake is hand-written (no emulator exists for our own API): it answers scripted
responses per (method, path) and records every request, so the tests check what the
CLI sends and how it shows what comes back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tensorant_cli.main import main, progress_bar


class FakeApi:
    def __init__(self) -> None:
        # (method, path) -> list of (status, content_type, body); the last one repeats.
        self.routes: dict[tuple[str, str], list[tuple[int, str, Any]]] = {}
        self.requests: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                api.requests.append({"method": self.command, "path": self.path, "body": body,
                                     "headers": dict(self.headers.items())})
                answers = api.routes.get((self.command, path))
                if not answers:
                    status, ctype, payload = 404, "application/problem+json", {"title": "Not found", "status": 404}
                else:
                    status, ctype, payload = answers.pop(0) if len(answers) > 1 else answers[0]
                data = json.dumps(payload).encode() if payload is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def on(self, method: str, path: str, *answers: Any, status: int = 200,
           ctype: str = "application/json") -> None:
        self.routes[(method, path)] = [(status, ctype, a) for a in answers]

    def sent(self, method: str, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == method and r["path"].split("?")[0] == path]


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def run_cli(api: FakeApi, *argv: str) -> int:
    return main(["--url", api.url, "--token", "tok-123", *argv])


def test_problem_json_error_prints_title_detail_and_fields(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("POST", "/api/runs", {
        "type": "about:blank", "title": "Invalid input", "status": 422, "detail": "2 fields are invalid",
        "errors": [{"field": "price_limit_per_hour", "message": "must be greater than 0"},
                   {"field": "offer_id", "message": "no such offer in the catalog"}],
    }, status=422, ctype="application/problem+json")
    code = run_cli(api, "runs", "create", "--project", "p1", "--dataset", "d1", "--provider", "local",
                   "--offer", "nope", "--base-model", "m", "--price-limit", "0")
    err = capsys.readouterr().err
    assert code == 1
    assert "Invalid input (HTTP 422)" in err and "2 fields are invalid" in err
    assert "price_limit_per_hour: must be greater than 0" in err
    assert "offer_id: no such offer in the catalog" in err
    sent = json.loads(api.sent("POST", "/api/runs")[0]["body"])
    assert sent == {"project_id": "p1", "dataset_version_id": "d1", "provider": "local", "offer_id": "nope",
                    "base_model": "m", "price_limit_per_hour": 0.0, "kind": "trial"}
    assert api.requests[0]["headers"]["Authorization"] == "Bearer tok-123"


def test_unreachable_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", "http://127.0.0.1:9", "projects", "list"]) == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


def test_dev_token_decodes_with_org_role_and_sub(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import jwt

    from shared.settings import get_settings, reset_settings

    monkeypatch.chdir(tmp_path)  # no local.settings.json here
    monkeypatch.setenv("TENSORANT_JWT_SECRET", "a-test-secret-that-is-long-enough-0123456789")
    reset_settings()
    try:
        assert main(["dev-token", "--org", "acme", "--role", "admin", "--sub", "ann"]) == 0
        token = capsys.readouterr().out.strip()
        assert "\n" not in token
        claims = jwt.decode(token, get_settings().jwt_secret, algorithms=["HS256"], audience="tensorant-api")
        assert (claims["org"], claims["role"], claims["sub"], claims["typ"]) == ("acme", "admin", "ann", "user")
    finally:
        monkeypatch.delenv("TENSORANT_JWT_SECRET")
        reset_settings()


def _run(state: str, progress: float = 0.0, phase: str = "", **extra: Any) -> dict[str, Any]:
    return {"id": "r1", "state": state, "phase": phase, "progress": progress, "reason": "", **extra}


def test_watch_exits_0_on_succeeded(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("GET", "/api/runs/r1", _run("provisioning"), _run("training", 0.5, "training"),
           _run("training", 0.5, "training"), _run("succeeded", 1.0, outcome="succeeded"))
    assert run_cli(api, "runs", "watch", "r1", "--interval", "0.01") == 0
    out = capsys.readouterr().out.splitlines()
    # Not a TTY: one line per change, not per poll.
    assert [line.split()[1] for line in out[:3]] == ["state=provisioning", "state=training", "state=succeeded"]
    assert progress_bar(0.5) in out[1] and "phase=training" in out[1]
    assert out[-1] == "run r1 succeeded"


@pytest.mark.parametrize("final", ["retained", "failed", "cancelled"])
def test_watch_exits_1_otherwise(api: FakeApi, capsys: pytest.CaptureFixture[str], final: str) -> None:
    api.on("GET", "/api/runs/r1", _run("training", 0.2, "training"),
           _run(final, 0.2, reason="heartbeat lost", billing_note="disk kept: about $0.01/hour"))
    assert run_cli(api, "runs", "watch", "r1", "--interval", "0.01") == 1
    out = capsys.readouterr().out
    assert f"state={final}" in out and "reason: heartbeat lost" in out and "billing: disk kept" in out


def test_uploads_and_json_bodies(api: FakeApi, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "train.jsonl"
    data.write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": "d"}\n')
    api.on("POST", "/api/projects/p1/datasets", {"id": "dv1", "rows": 2, "sha256": "ab"}, status=201)
    assert run_cli(api, "datasets", "upload", "p1", str(data)) == 0
    req = api.sent("POST", "/api/projects/p1/datasets")[0]
    assert req["body"] == data.read_bytes() and req["headers"]["Content-Type"] == "application/x-ndjson"
    assert "dv1: 2 rows" in capsys.readouterr().out

    body = tmp_path / "aws.json"
    body.write_text(json.dumps({"region": "us-east-1", "credentials": {"kind": "role"}}))
    api.on("PUT", "/api/connections/compute/aws", {"provider": "aws", "status": "checking", "checks": []})
    assert run_cli(api, "connections", "save-compute", "aws", "--file", str(body),
                   "--set", "credentials.role_arn=arn:aws:iam::123456789012:role/t", "--set", "max_gpus=2") == 0
    sent = json.loads(api.sent("PUT", "/api/connections/compute/aws")[0]["body"])
    assert sent == {"region": "us-east-1", "max_gpus": 2,
                    "credentials": {"kind": "role", "role_arn": "arn:aws:iam::123456789012:role/t"}}

    adapter = tmp_path / "adapter.zip"
    adapter.write_bytes(b"PK\x03\x04zip")
    api.on("POST", "/api/runs/r1/recover", _run("recovering"))
    assert run_cli(api, "runs", "recover", "r1", "--upload", str(adapter)) == 0
    req = api.sent("POST", "/api/runs/r1/recover")[0]
    assert req["body"] == b"PK\x03\x04zip" and req["headers"]["Content-Type"] == "application/zip"
    assert run_cli(api, "runs", "recover", "r1", "--verify-saved") == 0
    assert json.loads(api.sent("POST", "/api/runs/r1/recover")[1]["body"]) == {"mode": "verify_saved"}


def test_launch_needs_confirmation(api: FakeApi, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    api.on("GET", "/api/runs/r1", _run("draft", estimate_per_hour=1.25, price_limit_per_hour=2.0,
                                        offer={"gpu": "L4", "machine_type": "g6.xlarge", "region": "us-east-1"}))
    api.on("POST", "/api/runs/r1/launch", _run("queued"))
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a TTY: no prompt possible
    assert run_cli(api, "runs", "launch", "r1") == 1
    assert api.sent("POST", "/api/runs/r1/launch") == []
    assert "Estimate: 1.25 USD/hour" in capsys.readouterr().out
    assert run_cli(api, "runs", "launch", "r1", "--yes") == 0
    assert json.loads(api.sent("POST", "/api/runs/r1/launch")[0]["body"]) == {"confirm": True}


def test_admin_poison_and_cancel(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("GET", "/api/platform/queues/launch/poison", {"items": [
        {"id": "m1", "run_id": "r1", "org": "o", "body": {}, "dequeue_count": 5, "inserted_on": "t",
         "last_error": "boom"}]})
    assert run_cli(api, "admin", "poison", "list", "launch") == 0
    assert "m1" in capsys.readouterr().out
    api.on("POST", "/api/platform/queues/launch/poison/replay", {"replayed": ["m1"]})
    assert run_cli(api, "admin", "poison", "replay", "launch", "--id", "m1") == 0
    assert "replayed 1 message(s) onto launch: m1" in capsys.readouterr().out
    assert json.loads(api.sent("POST", "/api/platform/queues/launch/poison/replay")[0]["body"]) == {"message_id": "m1"}
    api.on("DELETE", "/api/platform/queues/launch/poison/m1", None, status=204)
    assert run_cli(api, "admin", "poison", "discard", "launch", "--id", "m1") == 0
    api.on("POST", "/api/platform/sweep", {"leaks": []})
    assert run_cli(api, "admin", "sweep") == 0
    assert json.loads(api.sent("POST", "/api/platform/sweep")[0]["body"]) == {"dry_run": True}
    api.on("POST", "/api/runs/r1/cancel", _run("releasing"))
    assert run_cli(api, "runs", "cancel", "r1", "--keep") == 0
    assert json.loads(api.sent("POST", "/api/runs/r1/cancel")[0]["body"]) == {"discard": False}


def test_watch_refreshes_in_place_on_a_tty(api: FakeApi) -> None:
    import io

    from tensorant_cli.client import Client
    from tensorant_cli.main import watch

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    api.on("GET", "/api/runs/r1", _run("training", 0.3, "training"), _run("training", 0.6, "training"),
           _run("succeeded", 1.0))
    out = Tty()
    assert watch(Client(api.url, "t"), "r1", interval=0.01, stream=out) == 0
    text = out.getvalue()
    assert text.count("\r\033[K") == 3  # every poll redraws the same line
    assert text.splitlines()[-1] == "run r1 succeeded"


def test_logs_follow_prints_each_line_once(api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("GET", "/api/runs/r1/logs", {"lines": ["step 1"]}, {"lines": ["step 1", "step 2"]},
           {"lines": ["step 1", "step 2", "done"]})
    api.on("GET", "/api/runs/r1", _run("training"), _run("succeeded"))
    assert run_cli(api, "runs", "logs", "r1", "--follow", "--interval", "0.01") == 0
    assert capsys.readouterr().out.splitlines() == ["step 1", "step 2", "done"]
