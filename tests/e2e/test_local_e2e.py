"""End to end over HTTP: the local host serving the real app on Azurite, the local provider
starting the real agent process with the smoke trainer, a verified adapter, the machine released."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from shared.models import Role
from tests.azurite import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


class Client:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.s = requests.Session()
        self.s.headers["Authorization"] = f"Bearer {token}"

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        r = self.s.request(method, self.url + path, timeout=30, **kw)
        assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def wait(self, path: str, done: Any, timeout: float = 90) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            body = self("GET", path)
            if done(body) or time.monotonic() > deadline:
                return body
            time.sleep(0.2)


@pytest.fixture
def api(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    from shared import settings
    from shared.security import mint_user_token
    from tensorant_devhost.host import Host

    port = free_port()
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", f"http://127.0.0.1:{port}")
    settings.reset_settings()
    import function_app

    host = Host(function_app.app, root=ROOT, port=port, load_settings=False, timers=False).start()
    client = Client(host.url, mint_user_token("owner@a", "org-a", Role.owner))
    yield client
    host.stop()
    release_local_leaks()


def release_local_leaks() -> None:
    """After a test of the local provider: nothing of it may be left running whatever the test did,
    and a leak is cleaned before the test fails on it."""
    from shared import settings
    from shared.providers.base import RunRef
    from shared.providers.local.compute import LocalCompute
    from shared.providers.local.config import LocalConfig

    local = LocalCompute(LocalConfig(), settings.get_settings())
    leaks = list(local.list_managed())
    for res in leaks:
        local.release(RunRef(settings.get_settings().deployment_id, res.org, res.run_id), [res])
    assert not leaks, leaks


def setup_org(api: Client) -> tuple[str, str]:
    api("PUT", "/api/connections/storage", json={"kind": "local"})
    api("PUT", "/api/connections/compute/local", json={})
    conn = api.wait("/api/connections/compute/local", lambda c: c["status"] != "checking", 30)
    assert conn["status"] == "connected", conn
    project = api("POST", "/api/projects", json={"name": "demo"})
    lines = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]})
             for i in range(4)]
    ds = api("POST", f"/api/projects/{project['id']}/datasets", data="\n".join(lines).encode(),
             headers={"Content-Type": "application/x-ndjson"})
    return project["id"], ds["id"]


def start_run(api: Client, project: str, dataset: str) -> str:
    offers = api("GET", "/api/catalog/gpus?provider=local")["items"]
    run = api("POST", "/api/runs", json={"project_id": project, "dataset_version_id": dataset, "provider": "local",
                                         "offer_id": offers[0]["offer_id"], "base_model": "tensorant/smoke-tiny",
                                         "price_limit_per_hour": 1.0})
    assert run["state"] == "draft"
    api("POST", f"/api/runs/{run['id']}/launch", json={"confirm": True})
    return str(run["id"])


TERMINAL_OR_RETAINED = {"succeeded", "failed", "cancelled", "retained"}


def test_trial_reaches_succeeded_over_http(api: Client) -> None:
    # The host indexed the app already; the OpenAPI handler must still read the routes.
    assert "/api/runs/{id}" in api("GET", "/api/openapi.json")["paths"]
    project, dataset = setup_org(api)
    run_id = start_run(api, project, dataset)
    run = api.wait(f"/api/runs/{run_id}", lambda r: r["state"] in TERMINAL_OR_RETAINED)
    assert run["state"] == "succeeded", run
    walked = [e["message"].split(":")[0] for e in run["events"] if e["kind"] == "transition"]
    for step in ("queued -> provisioning", "provisioning -> preparing", "preparing -> training",
                 "training -> exporting", "exporting -> verifying", "verifying -> releasing",
                 "releasing -> succeeded"):
        assert step in walked, walked
    assert len(run["adapter_sha256"]) == 64
    assert any("progress=" in line for line in api("GET", f"/api/runs/{run_id}/logs")["lines"])


def test_failing_trainer_is_retained_then_recovered_by_upload(api: Client, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from shared import settings

    # The trainer command is the operator's setting (issue 11.1), not a connection field.
    monkeypatch.setenv("TENSORANT_TRAINER_COMMAND", "sh -c 'echo partial > \"$TENSORANT_OUTPUT_DIR/ckpt\"; echo boom; exit 3'")
    # (It writes some output before failing: only then is there something to retain, issue 12.5.)
    settings.reset_settings()
    project, dataset = setup_org(api)
    run_id = start_run(api, project, dataset)
    run = api.wait(f"/api/runs/{run_id}", lambda r: r["state"] in TERMINAL_OR_RETAINED)
    assert run["state"] == "retained", run
    assert "exit code 3" in run["reason"]
    from tests.harness import smoke_adapter_zip

    api("POST", f"/api/runs/{run_id}/recover", data=smoke_adapter_zip(),
        headers={"Content-Type": "application/zip"})
    run = api.wait(f"/api/runs/{run_id}", lambda r: r["state"] in TERMINAL_OR_RETAINED - {"retained"})
    assert run["state"] == "succeeded", run
