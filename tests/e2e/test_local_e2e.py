"""End to end over HTTP: the local host serving the real app on Azurite, the local provider
starting the real agent process with the smoke trainer, a verified adapter, the machine released."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.local_host import TERMINAL_OR_RETAINED, Client

pytestmark = pytest.mark.e2e


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

    # The trainer command is the operator's setting, not a connection field (an owner must not run
    # commands on the control plane's host).
    monkeypatch.setenv("TENSORANT_TRAINER_COMMAND", "sh -c 'echo partial > \"$TENSORANT_OUTPUT_DIR/ckpt\"; echo boom; exit 3'")
    # (It writes some output before failing: only then is there something to retain.)
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
