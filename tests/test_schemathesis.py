"""Schemathesis against the app over real HTTP: every documented operation, with
generated and example requests, answers no 5xx and only what /api/openapi.json documents:
its statuses, content types and response schemas. Once as an owner, once as a member.

The dev host serves the real app on Azurite without queue pollers or timers, so nothing a
request queues runs: a launch leaves its run queued (no machine is started, and cleanup cancels
it) and the seeded connections stay as seeded. The org is seeded first (local storage and
compute, a project, a dataset, drafts, a launched run for the agent routes, a succeeded run with
its adapter), and every `id` in a path is a seeded record's (a generated one would only be a
404), so the requests reach real records; the documented run-create example is sent with the
seeded ids. Agent routes are called with the seeded run's agent token; platform routes (admins)
answer these tokens 403.
"""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from shared.models import Role
from shared.openapi import EXAMPLES
from shared.services.api.quotas import OrgLimits
from tests.azurite import Azurite, free_port
from tests.support.storage import clear_queues, drop_tables

ROOT = Path(__file__).resolve().parents[1]
ORG = "org-a"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
MAX_EXAMPLES = 5  # generated requests per operation and role, after the documented examples
SEED = 1  # a fixed seed: the same requests every run

# Request bodies that are not JSON: the dataset upload (text) and the adapter upload (bytes).
schemathesis.serializer.alias("application/x-ndjson", "text/plain")
schemathesis.serializer.alias("application/zip", "application/octet-stream")

# Which seeded run each run operation acts on: those that change a run's state get their own.
RUN_OF = {"delete_run": "doomed", "cancel_run": "to_cancel", "launch_run": "to_launch", "run_adapter": "succeeded"}
# Compute connection writes go to a provider that is not the seeded one: the local connection
# stays connected (a launch needs it), and no saved RunPod key makes /runpod/volumes call RunPod.
WRITES_TO_AWS = {"save_compute", "delete_compute", "check_compute"}


@dataclass
class Seeded:
    url: str
    user_token: str  # the role's, for the requests under test
    owner_token: str  # for seeding
    project: str = ""
    dataset: str = ""
    offer: str = ""
    runs: dict[str, str] = field(default_factory=dict)
    agent_token: str = ""

    def call(self, method: str, path: str, **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.owner_token}", **kw.pop("headers", {})}
        r = requests.request(method, self.url + path, headers=headers, timeout=30, **kw)
        assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def create_body(self) -> dict[str, Any]:
        return {"project_id": self.project, "dataset_version_id": self.dataset, "provider": "local",
                "offer_id": self.offer, "base_model": "tensorant/smoke-tiny", "price_limit_per_hour": 1.0}

    def draft(self) -> str:
        return str(self.call("POST", "/api/runs", json=self.create_body())["id"])


def _seed(host: Any, seeded: Seeded) -> None:
    from shared.clock import now
    from shared.context import invocation
    from shared.models import Outcome, RunState
    from shared.org_storage.base import adapter_key
    from shared.runs.org_backends import storage_for
    from shared.security import mint_agent_token
    from shared.store import get_store
    from tests.support.adapters import build_adapter_zip

    seeded.call("PUT", "/api/connections/storage", json={"kind": "local"})
    seeded.call("PUT", "/api/connections/compute/local", json={})
    host.drain()  # the connection checks (and the catalog they fill), before anything is launched
    assert seeded.call("GET", "/api/connections/compute/local")["status"] == "connected"
    seeded.offer = seeded.call("GET", "/api/catalog/gpus?provider=local")["items"][0]["offer_id"]
    seeded.project = seeded.call("POST", "/api/projects", json={"name": "demo"})["id"]
    lines = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]})
             for i in range(4)]
    seeded.dataset = seeded.call("POST", f"/api/projects/{seeded.project}/datasets", data="\n".join(lines).encode(),
                                 headers={"Content-Type": "application/x-ndjson"})["id"]
    for name in ("draft", "doomed", "to_cancel", "to_launch", "agent", "succeeded"):
        seeded.runs[name] = seeded.draft()
    # The agent routes act on a launched run (queued: no poller takes the launch message).
    seeded.call("POST", f"/api/runs/{seeded.runs['agent']}/launch", json={"confirm": True})
    seeded.agent_token = mint_agent_token(ORG, seeded.runs["agent"])
    # A succeeded run with its verified adapter in local storage: the adapter route answers application/zip.
    data = build_adapter_zip("tensorant/smoke-tiny")
    run_id = seeded.runs["succeeded"]
    storage_for(invocation(), ORG).put(adapter_key(run_id), data)
    t = now()
    # Written as a record (runs.put): a draft does not become succeeded through the one write's table.
    draft, etag = get_store().runs.get(ORG, run_id)
    get_store().runs.put(draft.model_copy(update={
        "state": RunState.succeeded, "outcome": Outcome.succeeded, "launched_at": t, "released_at": t,
        "state_changed_at": t, "adapter_sha256": hashlib.sha256(data).hexdigest(), "adapter_size": len(data)}), etag)


def _cleanup(seeded: Seeded) -> None:
    """Cancel what a launch queued, then check that nothing runs (as tests/e2e/test_local_e2e.py does)."""
    from tests.e2e.local_host import release_local_leaks

    for name in ("agent", "to_launch"):
        requests.post(f"{seeded.url}/api/runs/{seeded.runs[name]}/cancel", json={"discard": True}, timeout=30,
                      headers={"Authorization": f"Bearer {seeded.owner_token}"})
    release_local_leaks()


@pytest.fixture(scope="module", params=[Role.owner, Role.member], ids=lambda r: r.value)
def served(request: pytest.FixtureRequest, azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """The app on the dev host, its org seeded; one per role (the `env` fixture's settings, for the module)."""
    from shared import queues
    from shared import settings as app_settings
    from shared.security import mint_user_token
    from shared.store import get_store, reset_store
    from tensorant_devhost.host import Host

    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AzureWebJobsStorage": azurite.connection_string, "TENSORANT_TABLE_PREFIX": "t" + secrets.token_hex(4),
            "TENSORANT_LOCAL_ROOT": str(tmp_path_factory.mktemp("local")), "TENSORANT_DEPLOYMENT_ID": "test",
            "TENSORANT_TRAINER_COMMAND": f"{sys.executable} -m machine.trainer.smoke", "TENSORANT_ALLOW_TEST_MODELS": "1",
            "TENSORANT_PUBLIC_URL": f"http://127.0.0.1:{port}",
        }.items():
            mp.setenv(key, value)
        app_settings.reset_settings()
        reset_store()
        queues.reset_queues()
        clear_queues(queues.get_queues())
        import function_app

        host = Host(function_app.app, root=ROOT, port=port, load_settings=False, queues=False, timers=False).start()
        role: Role = request.param
        seeded = Seeded(url=host.url, user_token=mint_user_token(f"{role.value}@a", ORG, role),
                        owner_token=mint_user_token("owner@a", ORG, Role.owner))
        try:
            # The document under test is the one the app serves.
            assert requests.get(host.url + "/api/openapi.json", timeout=30).json() == DOCUMENT
            _seed(host, seeded)
            yield seeded
            _cleanup(seeded)
        finally:
            host.stop()
            drop_tables(get_store())
            app_settings.reset_settings()
            reset_store()
            queues.reset_queues()


def _document() -> dict[str, Any]:
    import function_app
    from shared import settings as app_settings
    from shared.openapi import build

    try:
        return json.loads(json.dumps(build(function_app.app)))  # as served: plain JSON
    finally:
        app_settings.reset_settings()  # read at collection: not kept for the tests that follow


DOCUMENT = _document()
_TESTED = copy.deepcopy(DOCUMENT)
# The docs page's files: one real name to reach them (generated names answer 404).
_TESTED["paths"]["/api/docs/assets/{name}"]["get"]["parameters"][0]["example"] = "swagger-ui.css"
schema = schemathesis.openapi.from_dict(_TESTED, config=schemathesis.Config.from_dict({
    # The documented examples, then generated requests (valid and invalid); the coverage phase's
    # exhaustive boundary cases and the stateful phase are left out to bound the run time.
    "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
    "seed": SEED,
}))


def _path_value(op_id: str, path: str, name: str, served: Seeded) -> str | None:
    if name == "id" and path.startswith("/api/projects/"):
        return served.project
    if name == "id" and path.startswith("/api/agent/"):
        return served.runs["agent"]
    if name == "id":
        return served.runs[RUN_OF.get(op_id, "draft")]
    if name == "provider" and op_id in WRITES_TO_AWS:
        return "aws"
    return None


@settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None)
@schema.parametrize()
def test_api_answers_what_its_document_says(case: Any, served: Seeded) -> None:
    case = case.derive(keep_auth=True)  # the examples' cases are shared by both roles: changes go to a copy
    op_id = case.operation.definition.raw["operationId"]
    for name in ("id", "provider"):
        value = _path_value(op_id, case.path, name, served) if name in case.path_parameters else None
        if value is not None:
            case.path_parameters = {**case.path_parameters, name: value}
    if op_id == "create_run" and case.body == EXAMPLES["RunCreate"]:
        case.body = served.create_body()  # the documented example, with the seeded records
    token = served.agent_token if case.path.startswith("/api/agent/") else served.user_token
    try:
        case.call_and_validate(base_url=served.url, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS)
    finally:
        if op_id == "put_limits":  # generated limits would refuse the run requests that follow
            served.call("PUT", "/api/org/limits", json=OrgLimits().model_dump())
