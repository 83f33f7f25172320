"""HTTP API behaviour through the real handlers: roles, org isolation, secrets, problem+json."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from pydantic import BaseModel, ConfigDict, SecretStr

from shared.models import Role
from shared.providers import registry
from shared.security import mint_agent_token, mint_user_token
from tests.fakes import Cloud, MemoryCompute
from tests.harness import Harness

SECRET = "sk-live-DO-NOT-LEAK-1234567890"


class SecretConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    api_key: SecretStr
    region: str = "r1"


@pytest.fixture
def secretive(cloud: Cloud) -> Iterator[None]:
    """A provider whose config holds a secret (SecretConfig), on the memory cloud."""
    undo = registry.override("secretive", factory=lambda config, settings: MemoryCompute(config, settings, cloud),
                             config_model=SecretConfig)
    yield
    undo()


def test_member_cannot_save_a_connection(harness: Harness) -> None:
    status, body, headers = harness.call("PUT", "/api/connections/compute/memory", token="member", json_body={})
    assert status == 403
    assert headers["Content-Type"] == "application/problem+json"
    assert "owner" in body["detail"]


def test_no_token_is_401_with_a_hint(harness: Harness) -> None:
    status, body, _ = harness.call("GET", "/api/runs", token=None)
    assert status == 401 and "Bearer" in body["detail"]


def test_another_org_sees_404(harness: Harness) -> None:
    harness.save_compute("memory", {})
    run_id = harness.create_run("memory", "mem-a10")
    other = mint_user_token("eve@b", "org-b", Role.owner)
    for path in (f"/api/runs/{run_id}", f"/api/runs/{run_id}/logs"):
        status, body, _ = harness.call("GET", path, token=other)
        assert status == 404, path
    status, _, _ = harness.call("POST", f"/api/runs/{run_id}/cancel", token=other, json_body={"discard": True})
    assert status == 404
    assert harness.ok("GET", "/api/runs", token=other)["items"] == []
    assert harness.get_run(run_id)["state"] == "draft"


def test_agent_endpoints_take_only_that_runs_token(harness: Harness) -> None:
    harness.save_compute("memory", {})
    run_a = harness.create_run("memory", "mem-a10")
    run_b = harness.create_run("memory", "mem-a10")
    harness.launch(run_a)
    hb = {"phase": "training", "progress": 0.1, "logs": []}
    status, _, _ = harness.call("POST", f"/api/agent/runs/{run_a}/heartbeat", token=mint_agent_token("org-a", run_b),
                          json_body=hb)
    assert status == 403
    status, _, _ = harness.call("POST", f"/api/agent/runs/{run_a}/heartbeat", token="owner", json_body=hb)
    assert status == 403
    status, _, _ = harness.call("POST", f"/api/agent/runs/{run_a}/heartbeat", token=mint_agent_token("org-a", run_a),
                          json_body=hb)
    assert status == 200
    assert harness.get_run(run_a)["state"] == "training"


def test_secrets_are_write_only_and_never_logged(harness: Harness, secretive: None, caplog: pytest.LogCaptureFixture,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    saved = harness.ok("PUT", "/api/connections/compute/secretive", json_body={"api_key": SECRET})
    harness.drain()
    shown = harness.ok("GET", "/api/connections/compute/secretive")
    listed = harness.ok("GET", "/api/connections")
    assert shown["config"]["api_key"] == {"set": True}
    # A save without the secret keeps it (write-only field); a wrong type names the field.
    harness.ok("PUT", "/api/connections/compute/secretive", json_body={"region": "r2"})
    status, bad, _ = harness.call("PUT", "/api/connections/compute/secretive", json_body={"api_key": SECRET, "region": 5})
    assert status == 422 and bad["errors"][0]["field"] == "region"
    from shared.runs.org_backends import compute_connection_slot, unsealed_config
    from shared.store import get_store

    rec = get_store().connections.get("org-a", compute_connection_slot("secretive"))
    assert rec is not None
    assert unsealed_config(rec[0]).api_key.get_secret_value() == SECRET  # type: ignore[attr-defined]
    assert SECRET not in rec[0].sealed and SECRET not in json.dumps(rec[0].config)
    from shared.log import get_logger

    get_logger().info(f"provider said: bad key {SECRET}")
    out = capsys.readouterr()
    everything = json.dumps([saved, shown, listed, bad]) + caplog.text + out.out + out.err
    assert SECRET not in everything


def test_a_connection_saved_back_as_shown_keeps_its_secret(harness: Harness, secretive: None) -> None:
    """The console re-saves the config it was shown: {"set": true} in a secret's place keeps the stored one."""
    from shared.runs.org_backends import compute_connection_slot, unsealed_config
    from shared.store import get_store

    status, first, _ = harness.call("PUT", "/api/connections/compute/secretive", json_body={"api_key": {"set": True}})
    assert status == 422 and first["errors"][0]["field"] == "api_key" and "no saved secret" in first["detail"]
    harness.ok("PUT", "/api/connections/compute/secretive", json_body={"api_key": SECRET})
    harness.drain()
    shown = harness.ok("GET", "/api/connections/compute/secretive")["config"]
    harness.ok("PUT", "/api/connections/compute/secretive", json_body={**shown, "region": "r3"})
    harness.drain()
    rec = get_store().connections.get("org-a", compute_connection_slot("secretive"))
    assert rec is not None and rec[0].config["region"] == "r3"
    assert unsealed_config(rec[0]).api_key.get_secret_value() == SECRET  # type: ignore[attr-defined]
    # A new value replaces it; {"set": false} is not a value.
    harness.ok("PUT", "/api/connections/compute/secretive", json_body={"api_key": "sk-new-value-123"})
    rec = get_store().connections.get("org-a", compute_connection_slot("secretive"))
    assert rec is not None and unsealed_config(rec[0]).api_key.get_secret_value() == "sk-new-value-123"  # type: ignore[attr-defined]
    status, bad, _ = harness.call("PUT", "/api/connections/compute/secretive", json_body={"api_key": {"set": False}})
    assert status == 422 and bad["errors"][0]["field"] == "api_key"


def test_a_storage_connection_saved_back_as_shown_keeps_its_secret(harness: Harness) -> None:
    from shared.runs.org_backends import unsealed_config
    from shared.store import get_store

    body = {"kind": "s3", "region": "us-east-1", "bucket": "tensorant-adapters", "access_key_id": "AKIAEXAMPLE1",
            "secret_access_key": SECRET}
    harness.ok("PUT", "/api/connections/storage", json_body=body)
    shown = harness.ok("GET", "/api/connections/storage")["config"]
    assert shown["secret_access_key"] == {"set": True}
    harness.ok("PUT", "/api/connections/storage", json_body=shown)
    rec = get_store().connections.get("org-a", "storage")
    assert rec is not None
    assert unsealed_config(rec[0]).secret_access_key.get_secret_value() == SECRET  # type: ignore[attr-defined]


def test_unknown_provider_and_bad_json_name_the_field(harness: Harness) -> None:
    status, body, _ = harness.call("PUT", "/api/connections/compute/nimbus", json_body={})
    assert status == 422 and body["errors"][0]["field"] == "provider"
    status, body, _ = harness.call("POST", "/api/projects", body=b"{not json")
    assert status == 422 and body["errors"][0]["field"] == "body"
    status, body, _ = harness.call("POST", "/api/projects", json_body={"name": ""})
    assert status == 422 and body["errors"][0]["field"] == "name"


def test_dataset_lines_are_validated_with_line_numbers(harness: Harness) -> None:
    project = harness.ok("POST", "/api/projects", json_body={"name": "p"})
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    data = "\n".join([good, "{broken", json.dumps({"messages": [{"role": "user", "content": "x"}]}), good,
                      json.dumps({"prompt": "a", "completion": 3})]).encode()
    status, body, _ = harness.call("POST", f"/api/projects/{project['id']}/datasets", body=data,
                             content_type="application/x-ndjson")
    assert status == 422
    assert [e["line"] for e in body["errors"]] == [2, 3, 5]
    assert "assistant" in body["errors"][1]["message"]
    ok = harness.ok("POST", f"/api/projects/{project['id']}/datasets", body=(good + "\n" + good).encode(),
              content_type="application/x-ndjson")
    assert ok["rows"] == 2 and len(ok["sha256"]) == 64


def test_storage_location_cannot_change_once_projects_exist(harness: Harness, tmp_path: object) -> None:
    harness.ok("POST", "/api/projects", json_body={"name": "p"})
    status, body, _ = harness.call("PUT", "/api/connections/storage", json_body={
        "kind": "s3", "endpoint": "https://s3.example.com", "region": "us-east-1", "bucket": "elsewhere",
        "access_key_id": "AKIAEXAMPLE0", "secret_access_key": "x" * 40})
    assert status == 409 and "migration" in body["detail"]
    assert harness.ok("GET", "/api/connections/storage")["provider"] == "local"


def test_openapi_lists_every_route_with_models(harness: Harness) -> None:
    spec = harness.ok("GET", "/api/openapi.json", token=None)
    assert "/api/runs/{id}/launch" in spec["paths"]
    launch = spec["paths"]["/api/runs/{id}/launch"]["post"]
    assert launch["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("RunLaunch")
    assert "RunView" in spec["components"]["schemas"]
    routes = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert len(routes) == len(harness.routes)
    status, page, _ = harness.call("GET", "/api/docs", token=None)
    assert status == 200 and b"openapi.json" in page and b"https://" not in page


def test_a_save_made_while_a_check_records_its_verdict_is_made_again(harness: Harness, secretive: None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of the first save records its verdict between a re-save's read and write: the re-save is
    made again on a fresh read (it answered 409 "send it again" to the console's unchanged re-save)."""
    from shared.errors import ConcurrencyError
    from shared.store import get_store

    harness.ok("PUT", "/api/connections/compute/secretive", json_body={"api_key": SECRET})
    connections = get_store().connections
    real_put = connections.put
    raced: list[bool] = []

    def put_once_raced(rec: object, etag: str | None) -> str:
        if not raced:
            raced.append(True)
            raise ConcurrencyError("the check wrote its verdict meanwhile")
        return real_put(rec, etag)  # type: ignore[arg-type]

    monkeypatch.setattr(connections, "put", put_once_raced)
    saved = harness.ok("PUT", "/api/connections/compute/secretive", json_body={"api_key": {"set": True}, "region": "r9"})
    assert raced and saved["config"]["region"] == "r9"
