"""Generate a new compute provider's skeleton: `python -m tools.new_provider NAME [--root DIR]`.

After dstack's scripts/add_backend.py: it writes the provider package (shared/providers/NAME/, the
file set of shared/providers/README.md with every ComputeProvider method raising NotImplementedError
and a TODO saying what to implement, an empty but required error table), its fake cloud (a loopback
HTTP server skeleton under tests/providers/NAME/) and its contract wiring (a CloudContract class), then
prints the edits a person must still make. Nothing else needs an edit to register it: the registry finds
the package, and the API's and OpenAPI's provider lists read the registry.

The skeleton fails the provider contract until it is implemented (tests/test_new_provider.py checks
that it passes ruff and mypy, and that the contract refuses it): its methods raise, its error table is
empty, and its fake answers nothing yet.
"""

from __future__ import annotations

import argparse
import keyword
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^[a-z][a-z0-9]{1,19}$")  # a package name and a connection name's provider part


def _class(name: str) -> str:
    return name.capitalize()


def files(name: str) -> dict[str, str]:
    """Relative path -> content of every file the generator writes for provider `name`."""
    cls = _class(name)
    pkg = f"shared/providers/{name}"
    tests = f"tests/providers/{name}"
    subs = {"NAME": name, "CLS": cls}
    return {path: _fill(text, subs) for path, text in {
        f"{pkg}/__init__.py": INIT,
        f"{pkg}/config.py": CONFIG,
        f"{pkg}/sdk.py": SDK,
        f"{pkg}/errors.py": ERRORS,
        f"{pkg}/client.py": CLIENT,
        f"{pkg}/catalog.py": CATALOG,
        f"{pkg}/pricing.py": PRICING,
        f"{pkg}/checks.py": CHECKS,
        f"{pkg}/compute.py": COMPUTE,
        f"{tests}/__init__.py": "",
        f"{tests}/fake_server.py": FAKE_SERVER,
        f"{tests}/conftest.py": CONFTEST,
        f"{tests}/test_contract.py": TEST_CONTRACT,
    }.items()}


def _fill(text: str, subs: dict[str, str]) -> str:
    for key, value in subs.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def edits(name: str) -> list[str]:
    """The existing files a person must still change (a gate's test fails without it, or each cloud has it)."""
    return [
        "pyproject.toml [project] dependencies: the cloud SDK's distribution, for each LazyImport in "
        f"shared/providers/{name}/sdk.py (gate: tests/test_packaging.py)",
        "requirements.txt: `make lock` pins it, with its --hash lines (gate: tests/test_packaging.py)",
        "tests/conftest.py: the fake cloud's fixture and a harness on it for the e2e tests (convention: rig, arm)",
        "tests/e2e/test_bootstrap_e2e.py: the user data (or environment) the launch sent, run to `succeeded` "
        "(convention: its AWS, Azure and RunPod cases)",
        f"tests/providers/test_egress_docs.py: {name!r} in its list of clouds",
        f"infra/README.md: a line for infra/{name}/",
        "README.md: the clouds named at the top, the machine's egress table, the test doubles",
        "docs/architecture.md: the clouds in its first paragraph",
    ]


def by_hand(name: str) -> list[str]:
    """The new files whose content is the cloud's own, which a template cannot know (convention)."""
    return [
        f"infra/{name}/README.md: what the customer creates, with its `## Outbound network (egress)` section",
        f"infra/{name}/<role>: the least-privilege role the connection's credential needs",
        f"tests/providers/{name}/test_roles.py: every call of the lifecycle on the fake is granted by that role",
        f"tests/e2e/test_{name}_e2e.py: a run through the API on the fake cloud, launch to release",
    ]


def write(name: str, root: Path) -> list[Path]:
    if not NAME.match(name) or keyword.iskeyword(name):
        raise SystemExit(f"NAME must match {NAME.pattern} (a Python package name): {name!r}")
    if (root / "shared" / "providers" / name).exists() or (root / "tests" / "providers" / name).exists():
        raise SystemExit(f"shared/providers/{name} or tests/providers/{name} exists already: nothing written")
    written = []
    for rel, text in files(name).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    # The imports' order depends on the name (shared.providers.base before or after shared.providers.NAME):
    # the project's own isort settings put them in place, where ruff is installed.
    subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "I", "--fix", "-q", *map(str, written)],
                   cwd=root, capture_output=True, check=False)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.new_provider", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the provider's name: its package, its registry entry, its connections' name")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository to write into (default: this one)")
    args = parser.parse_args(argv)
    written = write(args.name, args.root)
    print(f"wrote {len(written)} files:")
    for path in written:
        print(f"  {path.relative_to(args.root)}")
    todo, new = edits(args.name), by_hand(args.name)
    print(f"\n{len(todo)} edits remain (by hand; the registry, the API's and OpenAPI's provider lists need none):")
    for i, line in enumerate(todo, 1):
        print(f"  {i}. {line}")
    print(f"\n{len(new)} files to write by hand (their content is the cloud's own):")
    for i, line in enumerate(new, 1):
        print(f"  {i}. {line}")
    print(f"\nThen implement every TODO until the contract passes: "
          f".venv/bin/python -m pytest -q tests/providers/{args.name}/test_contract.py")
    return 0


# ---------------------------------------------------------------- the templates ({{NAME}}, {{CLS}})

INIT = '''"""The `{{NAME}}` compute provider (generated by tools/new_provider.py; see shared/providers/README.md).
This module and `config` import no SDK."""

from __future__ import annotations

from pydantic import BaseModel

from shared.providers.{{NAME}} import sdk
from shared.providers.{{NAME}}.config import {{CLS}}Config
from shared.providers.base import ComputeProvider
from shared.providers.lazy import modules_of
from shared.providers.registry import ProviderInfo
from shared.settings import Settings


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    from shared.providers.{{NAME}} import compute  # the lifecycle module: only when a step needs it

    return compute.build(config, settings)


# TODO: declare what the cloud can do (resumes_training, ...: the fields of ProviderInfo), each only once
# the contract and its tests show it.
PROVIDER = ProviderInfo("{{NAME}}", {{CLS}}Config, build, {"api_key": "<{{NAME}} API key>"},
                        sdk_modules=modules_of(sdk))
'''

CONFIG = '''"""What an owner saves as the {{NAME}} compute connection. Imports no SDK."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class {{CLS}}Config(BaseModel):
    """The {{NAME}} compute connection. TODO: the fields the cloud needs (account, region, image, network),
    each with a pattern or bound and a description that says where the user finds it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_key: SecretStr = Field(description="The {{NAME}} API key")
    # Where the API is: tests point it at the fake cloud on loopback (tests/providers/{{NAME}}/fake_server.py).
    api_url: str = Field(default="https://api.{{NAME}}.invalid", pattern=r"^https?://[^\\s]+$", max_length=200,
                         description="The {{NAME}} API's base URL (TODO: the real one)")
'''

SDK = '''"""Every third-party module the {{NAME}} provider imports, one lazy adaptor each (shared/providers/lazy.py).

TODO: the cloud's SDK, one LazyImport per module the package imports (its distribution in pyproject.toml and
requirements.txt); until then the client speaks HTTP with requests."""

from __future__ import annotations

from shared.providers.lazy import LazyImport

NEEDED_BY = "the {{NAME}} provider"
requests = LazyImport("requests", "requests", needed_by=NEEDED_BY)
'''

ERRORS = '''"""Translate {{NAME}}'s errors into shared.errors, with reasons a user can act on."""

from __future__ import annotations

from shared.errors import ProviderError

# Each refusal kind of shared.providers.base.ERROR_KINDS -> the cloud's codes for it, as its wire carries them.
# Required: the provider contract (tests/providers/contract.py, CloudContract) fails while a kind has no code,
# and has the fake cloud answer each code to check the error class translate() makes of it.
# TODO: fill from the cloud's API reference (its error codes for no capacity, a quota, rejected credentials,
# a missing resource, throttling). A cloud without quotas names "quota" in ABSENT_KINDS with the reason.
ERROR_TABLE: dict[str, frozenset[str]] = {
    "capacity": frozenset(),
    "quota": frozenset(),
    "auth": frozenset(),
    "not_found": frozenset(),
    "throttled": frozenset(),
}
ABSENT_KINDS: dict[str, str] = {}


def translate(status: int, code: str, message: str, *, doing: str) -> ProviderError:
    """One refusal of the cloud -> one error of the shared tree; `doing` says what we were doing."""
    # TODO: CapacityError, QuotaError, AuthError, ThrottledError (retry_after_s from the answer) for the codes
    # of ERROR_TABLE, PermanentError for a missing resource and other refusals, RetryableError for 5xx.
    raise NotImplementedError(f"TODO: translate {{NAME}}'s {status} {code} while {doing}")
'''

CLIENT = '''"""The one door to {{NAME}}'s API: every answer is translated by errors.py here, and the credential's secret
is registered for redaction."""

from __future__ import annotations

from typing import Any

from shared.log import register_secret
from shared.providers.{{NAME}} import sdk
from shared.providers.{{NAME}}.config import {{CLS}}Config


class {{CLS}}Client:
    def __init__(self, config: {{CLS}}Config) -> None:
        self.config = config
        register_secret(config.api_key.get_secret_value())

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, *, doing: str) -> dict[str, Any]:
        """One API call; a refusal becomes errors.translate(status, code, message, doing=doing)."""
        requests = sdk.requests
        # TODO: the cloud's auth header, its error body's shape, retries of throttling within the budget.
        raise NotImplementedError(f"TODO: {method} {self.config.api_url}{path} with {requests.__name__} ({doing})")
'''

CATALOG = '''"""Which {{NAME}} machine types are supported (one GPU, x86_64, the trainer's GPUs), and lookups of them."""

from __future__ import annotations

from shared.models import GpuOffer
from shared.providers.{{NAME}}.client import {{CLS}}Client


def offers(client: {{CLS}}Client) -> list[GpuOffer]:
    # TODO: the supported single-GPU machine types, priced by pricing.py; none is a PermanentError saying
    # what to change.
    raise NotImplementedError("TODO: the {{NAME}} catalog")
'''

PRICING = '''"""{{NAME}}'s prices: compute and disk, per hour."""

from __future__ import annotations


def per_hour(machine_type: str, disk_gb: int) -> tuple[float, float]:
    """(compute, disk) in USD per hour."""
    # TODO: the cloud's price list (read, cached); an outage is a RetryableError.
    raise NotImplementedError(f"TODO: the {{NAME}} price of {machine_type} with {disk_gb} GB")
'''

CHECKS = '''"""The {{NAME}} connection's checks: named, with a fix hint each; creates nothing."""

from __future__ import annotations

from shared.models import Check
from shared.providers.{{NAME}}.client import {{CLS}}Client


def run_checks(client: {{CLS}}Client) -> list[Check]:
    # TODO: credentials, permissions, image, network: a failed Check with what to fix, never an exception.
    raise NotImplementedError("TODO: the {{NAME}} connection checks")
'''

COMPUTE = '''"""{{NAME}} compute: the lifecycle of one machine per run (shared/providers/base.py says what each method
promises). Generated: every method raises NotImplementedError until implemented, and the provider contract
(tests/providers/{{NAME}}/test_contract.py) fails until every one keeps its promise on the fake cloud."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from shared.models import Check, CloudResource, GpuOffer, MachineState
from shared.providers.{{NAME}}.client import {{CLS}}Client
from shared.providers.{{NAME}}.config import {{CLS}}Config
from shared.providers.base import CloudProgress, ComputeProvider, Description, LaunchSpec, RunRef
from shared.settings import Settings

# The cloud's machine states -> MachineState. TODO: every state the cloud reports.
STATE_MAP: dict[str, MachineState] = {}


class {{CLS}}Compute:
    name = "{{NAME}}"

    def __init__(self, config: {{CLS}}Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.client = {{CLS}}Client(config)

    def validate(self) -> list[Check]:
        raise NotImplementedError("TODO: checks.run_checks: credentials and setup, creating nothing")

    def offers(self) -> list[GpuOffer]:
        raise NotImplementedError("TODO: catalog.offers, priced compute + disk per hour")

    def preflight(self, offer: GpuOffer, ref: RunRef | None = None) -> str | None:
        raise NotImplementedError("TODO: why the offer cannot start (a quota read), or None; never raises")

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        raise NotImplementedError("TODO: find the run's machine by its marks, else create it marked, with the "
                                  "bootstrap (cloudinit.render or bootstrap_env.pod_env)")

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        raise NotImplementedError("TODO: the machine's state through STATE_MAP; not found is MachineState.gone")

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        raise NotImplementedError("TODO: stop the owned machine, keep its disk; not found is done")

    def start(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        raise NotImplementedError("TODO: start the retained machine; not found is a PermanentError")

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        raise NotImplementedError("TODO: delete the owned machine and its disk; done when the cloud confirms")

    def list_managed(self) -> Iterable[CloudResource]:
        raise NotImplementedError("TODO: page through the account, yield only this deployment's marked machines")

    def scope(self) -> dict[str, str]:
        raise NotImplementedError("TODO: the account (and region) the connection creates machines in")


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    """The registry's factory: mypy checks {{CLS}}Compute against the Protocol here."""
    if not isinstance(config, {{CLS}}Config):
        raise TypeError(f"{{NAME}} needs a {{CLS}}Config, not {type(config).__name__}")
    return {{CLS}}Compute(config, settings)
'''

FAKE_SERVER = '''"""A fake {{NAME}} API on loopback: the real client talks to it over HTTP, as to the cloud.

Generated skeleton (tools/new_provider.py). TODO: answer the requests the provider sends as the cloud does
(its paths, bodies and error bodies, from its API reference), keeping `machines` as the cloud's view. Until
then every request is answered 501, so the provider contract fails.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Fake{{CLS}}:
    def __init__(self, api_key: str = "{{NAME}}-test-key") -> None:
        self.api_key = api_key
        self.machines: dict[str, dict[str, Any]] = {}  # id -> the cloud's record (tags, state, disk, user data)
        self.requests: list[tuple[str, str, dict[str, Any]]] = []  # (method, path, body) as received
        self.refusal: tuple[int, str] | None = None  # (HTTP status, code): answer every request with it
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def start(self) -> Fake{{CLS}}:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.refusal is not None:
            status, code = self.refusal
            return status, {"error": {"code": code, "message": f"{code} (refused by the fake)"}}  # TODO: its shape
        # TODO: create, read, list (paged), stop, start and delete machines in self.machines.
        return 501, {"error": {"code": "NotImplemented", "message": f"the fake does not answer {method} {path} yet"}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                with fake.lock:
                    fake.requests.append((self.command, self.path, body))
                    status, answer = fake.answer(self.command, self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        return Handler
'''

CONFTEST = '''"""The fake {{NAME}} cloud, started per test (tests/providers/{{NAME}}/fake_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.providers.{{NAME}}.fake_server import Fake{{CLS}}


@pytest.fixture
def fake_{{NAME}}() -> Iterator[Fake{{CLS}}]:
    fake = Fake{{CLS}}().start()
    try:
        yield fake
    finally:
        fake.stop()
'''

TEST_CONTRACT = '''"""The provider contract suite for {{NAME}}, on its fake cloud (tests/providers/contract.py).

Generated (tools/new_provider.py): it fails until the provider and its fake are implemented."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from shared.models import GpuOffer
from shared.providers.{{NAME}}.compute import {{CLS}}Compute
from shared.providers.{{NAME}}.config import {{CLS}}Config
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from shared.settings import Settings
from tests.providers.contract import CloudContract, Foreign, Handed, ProviderEnv
from tests.providers.{{NAME}}.fake_server import Fake{{CLS}}

# TODO: an offer of the fake's catalog.
OFFER = GpuOffer(provider="{{NAME}}", offer_id="{{NAME}}-l4", gpu="NVIDIA L4", gpu_memory_gb=24, machine_type="l4",
                 region="r1", compute_per_hour=0.8, disk_per_hour=0.01, total_per_hour=0.81)
# TODO: the HTTP status the cloud answers each refusal kind with.
STATUS = {"capacity": 409, "quota": 409, "auth": 403, "not_found": 404, "throttled": 429}


def _spec(ref: RunRef) -> LaunchSpec:
    boot = Bootstrap(container_image="ghcr.io/tensorant/trainer:2026.11",
                     env={"TENSORANT_RUN_ID": ref.run_id, "TENSORANT_API_URL": "https://cp.example.com",
                          "TENSORANT_RUN_TOKEN": "tok-contract-{{NAME}}"},
                     secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"}))
    return LaunchSpec(ref=ref, offer=OFFER, bootstrap=boot)


class Test{{CLS}}Contract(CloudContract):
    @pytest.fixture
    def provider_env(self, fake_{{NAME}}: Fake{{CLS}}) -> Iterator[ProviderEnv]:
        fake = fake_{{NAME}}

        def mine(ref: RunRef) -> list[dict[str, object]]:
            # TODO: how the fake records the marks (tags, or the name where the cloud has none).
            return [m for m in fake.machines.values() if m.get("tags") == ref.tags]

        def machines(ref: RunRef) -> list[str]:
            return sorted(str(m["id"]) for m in mine(ref) if m.get("state") != "deleted")

        def disks(ref: RunRef) -> list[str]:
            return sorted(str(m["disk"]) for m in mine(ref) if m.get("disk"))

        def everything() -> dict[str, str]:
            return {str(m["id"]): str(m.get("state")) for m in fake.machines.values()}

        def add_foreign(kind: Foreign, ref: RunRef) -> list[str]:
            raise NotImplementedError("TODO: create a machine in the fake directly: unmarked, or another "
                                      "deployment's marks for the same org and run id")

        def handed(ref: RunRef) -> Handed:
            raise NotImplementedError("TODO: the user data (or environment and image) the fake recorded at create")

        @contextmanager
        def refuse(kind: str, code: str) -> Iterator[None]:
            fake.refusal = (STATUS[kind], code)
            try:
                yield
            finally:
                fake.refusal = None

        config = {{CLS}}Config(api_key=fake.api_key, api_url=fake.url)  # type: ignore[arg-type]
        yield ProviderEnv(
            provider={{CLS}}Compute(config, Settings(deployment_id="test")), ref=RunRef("test", "org-1", "run-c1"),
            spec=_spec, machines=machines, disks=disks, everything=everything, add_foreign=add_foreign,
            page_size=1,  # TODO: the cloud's smallest page
            handed=handed, list_requests=None, slow_release=None, refuse=refuse)
'''


if __name__ == "__main__":
    sys.exit(main())
