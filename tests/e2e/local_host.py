"""What the local end-to-end tests share: a client of the dev host's HTTP API, a started host for the
CLI's tests (LocalHost, start_local_host; the `local_host` fixture is in tests/conftest.py), and the
check that nothing of the local provider is left running after a test."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from shared.models import Role
from tensorant_cli.main import main
from tests.azurite import free_port

ROOT = Path(__file__).resolve().parents[2]
TERMINAL_OR_RETAINED = {"succeeded", "failed", "cancelled", "retained"}


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


class LocalHost:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def cli(self, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
        code = main(["--url", self.url, "--token", self.token, *argv])
        got = capsys.readouterr()
        return code, got.out, got.err

    def env(self) -> dict[str, str]:
        """The environment for a CLI subprocess (or a shell script) against this host."""
        path = os.pathsep.join([str(ROOT), str(ROOT / "tools" / "cli"), str(ROOT / "tools" / "devhost"),
                                str(ROOT / "tools" / "client")])
        return {**os.environ, "TENSORANT_URL": self.url, "TENSORANT_TOKEN": self.token, "PYTHONPATH": path}


def start_local_host(monkeypatch: pytest.MonkeyPatch, trainer_command: str | None) -> Iterator[LocalHost]:
    """The host of local_host; trainer_command None keeps the local provider's default, the real trainer."""
    from shared import settings
    from shared.security import mint_user_token
    from tensorant_devhost.host import Host

    port = free_port()
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", f"http://127.0.0.1:{port}")
    if trainer_command is None:
        monkeypatch.delenv("TENSORANT_TRAINER_COMMAND", raising=False)
    else:
        monkeypatch.setenv("TENSORANT_TRAINER_COMMAND", trainer_command)
    settings.reset_settings()
    import function_app

    host = Host(function_app.app, root=ROOT, port=port, load_settings=False, timers=False).start()
    yield LocalHost(host.url, mint_user_token("owner@a", "org-a", Role.owner))
    host.stop()
    from shared.providers.base import RunRef
    from shared.providers.local.compute import LocalCompute
    from shared.providers.local.config import LocalConfig
    from shared.store import get_store

    # Only this test's runs (its own tables): other test sessions on the same machine run
    # local agents under the same deployment id, and those are not ours to judge or end.
    mine = {r.id for org in ("org-a", "demo") for r in get_store().runs.in_org(org)}
    local = LocalCompute(LocalConfig(), settings.get_settings())
    leaks = [res for res in local.list_managed() if res.run_id in mine]
    for res in leaks:
        local.release(RunRef(settings.get_settings().deployment_id, res.org, res.run_id), [res])
    assert not leaks, leaks


@dataclass(frozen=True)
class LocalSetup:
    project_id: str
    dataset_id: str
    offer: dict[str, Any]  # the local offer for the base model
    checks: dict[str, Any]  # the local connection's checks by name


def local_training_setup(api: Client, project_name: str, base_model: str) -> LocalSetup:
    """Local storage and compute connected, a project with 12 arithmetic chats and the local offer
    for base_model: how the real trainer's end-to-end tests start."""
    api("PUT", "/api/connections/storage", json={"kind": "local"})
    api("PUT", "/api/connections/compute/local", json={})
    conn = api.wait("/api/connections/compute/local", lambda c: c["status"] != "checking", 30)
    assert conn["status"] == "connected", conn
    project = api("POST", "/api/projects", json={"name": project_name})
    rows = [json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                                     {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]})
            for i in range(12)]
    ds = api("POST", f"/api/projects/{project['id']}/datasets", data="\n".join(rows).encode(),
             headers={"Content-Type": "application/x-ndjson"})
    offer = api("GET", f"/api/catalog/gpus?provider=local&base_model={base_model}")["items"][0]
    return LocalSetup(project["id"], ds["id"], offer, {c["name"]: c for c in conn["checks"]})
