"""tensorant_client (tools/client): generated from the API's OpenAPI document and checked against it, its
errors typed, its retries bounded, its lists paged, and README's example run against the dev host."""

from __future__ import annotations

import copy
import inspect
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tensorant_client import Client, models
from tensorant_client.errors import ApiError, Conflict, InvalidInput, NotFound, RateLimited, Unavailable
from tensorant_client.generate import PAGE_ITEMS, sources
from tensorant_client.operations import OPERATIONS
from tensorant_client.transport import retry_after_s
from tests.harness import Harness

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- the client against the document


def drift(doc: dict[str, Any]) -> list[str]:
    """How the client differs from an OpenAPI document: each operation's method, route, path and query
    parameters and body, and each schema's fields (required or not) and enum values."""
    found: list[str] = []
    seen = set()
    for path, by_method in doc["paths"].items():
        for method, op in by_method.items():
            name = op["operationId"]
            seen.add(name)
            spec = OPERATIONS.get(name)
            if spec is None or not callable(getattr(Client, name, None)):
                found.append(f"{name}: no method for {method.upper()} {path}")
                continue
            params = op.get("parameters", [])
            want = (method.upper(), path, tuple(p["name"] for p in params if p["in"] == "path"),
                    tuple(p["name"] for p in params if p["in"] == "query"))
            if (spec.method, spec.path, spec.path_params, spec.query) != want:
                found.append(f"{name}: the client sends {spec.method} {spec.path} {spec.path_params} {spec.query}, "
                             f"the document says {want}")
            signature = set(inspect.signature(getattr(Client, name)).parameters) - {"self"}
            body = set((op.get("requestBody") or {}).get("content") or {})
            expected = {*want[2], *want[3]} | ({"body"} if "application/json" in body else set()) \
                | ({"data"} if body - {"application/json"} else set())
            if signature != expected:
                found.append(f"{name}: the method takes {sorted(signature)}, the document {sorted(expected)}")
    found += [f"{name}: not in the document" for name in sorted(set(OPERATIONS) - seen)]
    schemas: dict[str, Any] = doc["components"]["schemas"]
    for name, schema in schemas.items():
        if "enum" in schema:
            if models.ENUMS.get(name) != tuple(schema["enum"]):
                found.append(f"{name}: the client's values {models.ENUMS.get(name)}, the document's {schema['enum']}")
            continue
        model = models.MODELS.get(name)
        if model is None:
            found.append(f"{name}: no model")
            continue
        fields = {(f.alias or attr): f.is_required() for attr, f in model.model_fields.items()}
        props = {p: p in set(schema.get("required") or []) for p in schema.get("properties") or {}}
        if fields != props:
            found.append(f"{name}: the model's fields {fields}, the document's {props}")
    found += [f"{name}: not in the document" for name in sorted(set(models.MODELS) - set(schemas))]
    return found


def test_the_generated_modules_are_current() -> None:
    """models.py and operations.py are what `make client` writes for the app's document today: a route or a
    field added to the API without regenerating fails here."""
    import function_app
    from shared.openapi import build

    stale = [path.name for path, text in sources(build(function_app.app)).items() if path.read_text() != text]
    assert not stale, f"{', '.join(stale)} differ from the API's document: run `make client`"


def test_every_route_and_schema_of_the_running_app_is_in_the_client(env: dict[str, str]) -> None:
    """Against /api/openapi.json as the running app serves it: every operation a method with its route and
    parameters, every schema a model with its fields. (No test provider installed: `harness` adds the memory one.)"""
    doc = Harness().ok("GET", "/api/openapi.json")
    assert drift(doc) == []
    assert len(OPERATIONS) == sum(len(ops) for ops in doc["paths"].values()) >= 50


def test_drift_is_found() -> None:
    """The check above can fail: a new route, a new field, a changed route and a new enum value each show."""
    import function_app
    from shared.openapi import build

    doc = build(function_app.app)
    changed = copy.deepcopy(doc)
    changed["paths"]["/api/runs/{id}/pause"] = {"post": {"operationId": "pause_run", "parameters": [],
                                                         "responses": {"202": {}}}}
    changed["components"]["schemas"]["RunView"]["properties"]["paused_by"] = {"type": "string"}
    changed["paths"]["/api/runs/{id}"]["get"]["parameters"].append({"name": "fields", "in": "query"})
    changed["components"]["schemas"]["RunState"]["enum"].append("paused")
    found = drift(changed)
    assert any(f.startswith("pause_run: no method") for f in found), found
    assert any(f.startswith("RunView: ") and "paused_by" in f for f in found), found
    assert any(f.startswith("get_run: the client sends") for f in found), found
    assert any(f.startswith("RunState: ") for f in found), found


def test_models_read_the_apps_own_answers() -> None:
    """The generated models accept what the app's models dump (the API's answers), including fields the
    client does not know yet (extra fields are kept, not refused)."""
    from datetime import UTC, datetime

    from shared.models import ProjectRecord

    rec = ProjectRecord(org="o", id="p-1", name="demo", created_at=datetime.now(UTC))
    got = models.ProjectRecord.model_validate({**rec.model_dump(mode="json"), "added_later": 1})
    assert got.id == "p-1" and got.name == "demo" and got.model_extra == {"added_later": 1}
    # A body carries only the fields set: the API applies its own defaults.
    from tensorant_client.client import _json

    assert _json(models.RunLaunch(confirm=True)) == {"confirm": True}
    assert _json(models.TrainingSettings(max_steps=8)) == {"max_steps": 8}


# ---------------------------------------------------------------- errors, retries, waiting (a scripted server)


class Scripted:
    """A loopback HTTP server answering each request with the next scripted (status, headers, body)."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str], Any]] = []
        self.requests: list[tuple[str, str, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                outer.requests.append((self.command, self.path, self.rfile.read(length) if length else b""))
                status, headers, body = outer.answers.pop(0) if len(outer.answers) > 1 else outer.answers[0]
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                ctype = "application/problem+json" if status >= 400 else "application/json"
                for k, v in {"Content-Type": ctype, "Content-Length": str(len(data)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    s = Scripted()
    yield s
    s.server.shutdown()
    s.server.server_close()


def _problem(status: int, detail: str, errors: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"type": "about:blank", "title": "x", "status": status, "detail": detail, "errors": errors or []}


def _client(s: Scripted, waits: list[float]) -> Client:
    return Client(s.url + "/api", "tok", sleep=waits.append)


OFFER = {"provider": "local", "offer_id": "local-smoke", "gpu": "none", "gpu_memory_gb": 0, "machine_type": "local",
         "region": "local", "compute_per_hour": 0.0, "disk_per_hour": 0.0, "total_per_hour": 0.0}


def _run(state: str, **extra: Any) -> dict[str, Any]:
    """A run view as the API answers it (the required fields of RunView)."""
    return {"id": "r-1", "org": "o", "project_id": "p-1", "kind": "trial", "provider": "local", "state": state,
            "outcome": None, "phase": state, "progress": 0.5, "reason": "", "billing_note": "", "offer": OFFER,
            "estimate_per_hour": 0.0, "price_limit_per_hour": 1.0, "runtime_limit_s": 3600, "base_model": "m",
            "dataset_version_id": "d-1", "resources": [], "adapter_sha256": "", "release_error": "",
            "release_attempts": 0, "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
            **extra}


def test_problems_are_typed_exceptions_with_their_field_errors(scripted: Scripted) -> None:
    waits: list[float] = []
    api = _client(scripted, waits)
    scripted.answers = [(422, {}, _problem(422, "fix these fields", [
        {"field": "price_limit_per_hour", "message": "Input should be greater than 0"}]))]
    with pytest.raises(InvalidInput) as refused:
        api.create_run({"price_limit_per_hour": -1})
    assert refused.value.field("price_limit_per_hour") == "Input should be greater than 0"
    assert [(e.field, e.message) for e in refused.value.field_errors] == [
        ("price_limit_per_hour", "Input should be greater than 0")]
    scripted.answers = [(404, {}, _problem(404, "no run r-9 in this organization"))]
    with pytest.raises(NotFound, match="no run r-9"):
        api.get_run("r-9")
    scripted.answers = [(409, {}, _problem(409, "the run is training"))]
    with pytest.raises(Conflict):
        api.cancel_run("r-9", {})
    assert waits == []  # none of these is sent again
    assert len(scripted.requests) == 3 and scripted.requests[0][:2] == ("POST", "/api/runs")
    # A path parameter is one segment, whatever it holds.
    with pytest.raises(Conflict):
        api.get_run("../projects")
    assert scripted.requests[-1][1] == "/api/runs/..%2Fprojects"


def test_429_and_503_are_sent_again_after_retry_after_within_a_bound(scripted: Scripted) -> None:
    waits: list[float] = []
    api = _client(scripted, waits)
    scripted.answers = [(429, {"Retry-After": "7"}, _problem(429, "slow down")),
                        (503, {"Retry-After": "3"}, _problem(503, "store unreachable")),
                        (200, {}, _run("training"))]
    assert api.get_run("r-1").state == "training"
    assert waits == [7.0, 3.0] and len(scripted.requests) == 3
    # At most `retries` times: then the error, with when to try again.
    waits.clear()
    scripted.answers = [(503, {"Retry-After": "1"}, _problem(503, "store unreachable"))]
    with pytest.raises(Unavailable) as down:
        api.get_run("r-1")
    assert waits == [1.0, 1.0, 1.0] and down.value.retry_after == 1.0
    # A wait longer than the bound is not waited: raised at once, saying how long.
    waits.clear()
    scripted.answers = [(429, {"Retry-After": "3600"}, _problem(429, "an hour"))]
    with pytest.raises(RateLimited) as limited:
        api.get_run("r-1")
    assert waits == [] and limited.value.retry_after == 3600.0
    # No Retry-After: 2, 4, 8 s.
    scripted.answers = [(503, {}, _problem(503, "store unreachable"))]
    with pytest.raises(Unavailable):
        api.get_run("r-1")
    assert waits == [2.0, 4.0, 8.0]


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_s("12") == 12.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=lambda: 1445412480.0 - 30) == 30.0
    assert retry_after_s("soon") is None and retry_after_s(None) is None


def test_wait_for_returns_at_a_wanted_state_and_says_when_it_cannot_come(scripted: Scripted) -> None:
    from tensorant_client import WaitTimeout, WrongEnd

    waits: list[float] = []
    api = _client(scripted, waits)
    scripted.answers = [(200, {}, _run("queued")), (200, {}, _run("training")), (200, {}, _run("succeeded"))]
    assert api.wait_for("r-1", {"succeeded"}, timeout=60, interval=2).state == "succeeded"
    assert waits == [2, 2]
    scripted.answers = [(200, {}, _run("failed", reason="the trainer exited with code 1"))]
    with pytest.raises(WrongEnd, match="ended failed, not succeeded: the trainer exited"):
        api.wait_for("r-1", {"succeeded"})
    scripted.answers = [(200, {}, _run("training"))]
    with pytest.raises(WaitTimeout) as late:
        api.wait_for("r-1", {"retained", "succeeded"}, timeout=0)
    assert late.value.run.state == "training"


def test_lists_are_iterators_over_every_page(scripted: Scripted) -> None:
    waits: list[float] = []
    api = _client(scripted, waits)
    scripted.answers = [(200, {}, {"items": [_run("succeeded", id="r-1")], "next": "c1.sig"}),
                        (200, {}, {"items": [_run("failed", id="r-2")], "next": None})]
    runs = api.iter_runs(state="succeeded,failed", limit=1)
    assert [(r.id, type(r)) for r in runs] == [("r-1", models.RunView), ("r-2", models.RunView)]
    assert [p for _, p, _ in scripted.requests] == ["/api/runs?limit=1&state=succeeded%2Cfailed",
                                                    "/api/runs?limit=1&state=succeeded%2Cfailed&cursor=c1.sig"]


def test_an_unreachable_host_says_so() -> None:
    from tensorant_client.errors import Unreachable

    with pytest.raises(Unreachable, match=re.escape("cannot reach http://127.0.0.1:9")):
        Client("http://127.0.0.1:9", "t").get_run("r-1")
    assert issubclass(Unreachable, ApiError)


# ---------------------------------------------------------------- README's example, against the dev host


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- client-example:begin -->\s*```python\n(.*?)```\s*<!-- client-example:end -->", text, re.S)
    assert found, "README.md has no client example between <!-- client-example:begin/end --> markers"
    return found.group(1)


@pytest.mark.e2e
def test_readme_client_example_runs_against_the_dev_host(local_host: Any, tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "example.py"
    script.write_text(readme_example())
    proc = subprocess.run([sys.executable, str(script)], env=local_host.env(), capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("refused: [('price_limit_per_hour', "), lines
    run_id, state = lines[1].split()[:2]
    assert state == "succeeded" and run_id in lines[2], lines
    # The paged lists' items are what PAGE_ITEMS says (validated here against the live answers), a page at a time.
    api = Client(local_host.url, local_host.token)
    for name in ("more-1", "more-2"):
        api.create_project(models.ProjectCreate(name=name))
    projects = list(api.iter_projects(limit=1))
    assert len(projects) == 3 and all(isinstance(p, models.ProjectRecord) for p in projects)
    datasets = list(api.iter_datasets(projects[0].id if projects[0].name == "client-demo" else
                                      next(p.id for p in projects if p.name == "client-demo")))
    assert len(datasets) == 1 and isinstance(datasets[0], models.DatasetVersionRecord)
    assert set(PAGE_ITEMS) == {"list_runs", "list_projects", "list_datasets"}
