"""The fixtures every folder of the suite shares: a real Azurite, a fresh table prefix per test,
clean queues, a temp local root; the memory provider and a harness on it (a module needing another kind
of memory cloud overrides `cloud`); the store's table-call counter; moto's S3; the fake API
the CLI talks to; the AWS rig (moto's EC2 and the Pricing API fake) and the fake Azure ARM server,
which the provider tests, the e2e tests and top-level tests share. Imports stay inside the
fixtures: collecting a module that needs none of them (tests/trainer) loads nothing of the control
plane. Under pytest-xdist (make test) each worker has its own session fixtures (its own Azurite)."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.azurite import Azurite
from tests.support.storage import clear_queues, drop_tables

if TYPE_CHECKING:
    from shared.context import Context
    from tests.e2e.local_host import LocalHost
    from tests.fake_api import FakeApi
    from tests.fakes import Cloud
    from tests.harness import Harness
    from tests.providers.aws.pricing_server import PricingServer
    from tests.providers.aws.rig import Rig
    from tests.providers.azure.fake_arm import FakeArm
    from tests.table_calls import Calls

# moto's root credentials (moto accepts any); the buckets the S3 tests use.
MOTO_ROOT_KEYS = {"region_name": "us-east-1", "aws_access_key_id": "AKIAROOT0000", "aws_secret_access_key": "x" * 40}
DATA_BUCKET = "tensorant-data"  # an org's S3 storage
VOLUME_BUCKET = "vol0abc123"  # a RunPod network volume's id: its S3 API names the bucket after it


# Under pytest-xdist (make test: --dist loadfile, each file on one worker) these files are collected first,
# the longest first (--durations, summed per file: 2-4 minutes each down to about one), so that a worker
# starts each as soon as it is free instead of one being left for last while the other waits. Order within
# a file is kept; a run without workers keeps pytest's own order.
SLOW_FIRST = ("tests/trainer/test_dpo.py", "tests/test_benches.py", "tests/trainer/test_lora.py", "tests/chaos/test_chaos.py",
              "tests/e2e/test_failover_e2e.py", "tests/test_packaging.py", "tests/providers/test_registry.py",
              "tests/e2e/test_checkpoints_e2e.py", "tests/test_console_", "tests/chaos/", "tests/e2e/", "tests/gpu/",
              "tests/trainer/", "tests/test_schemathesis.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The marker `cloud` once read is gone; a module still marked would quietly get the plain memory provider.
    if stale := sorted({i.path.name for i in items if i.get_closest_marker("memory_provider")}):
        raise pytest.UsageError(f"{', '.join(stale)}: the memory_provider marker is gone; override the `cloud` "
                                "fixture in the module instead: `yield from serve_memory(SomeCloud(), SomeCompute)`")
    if not hasattr(config, "workerinput"):
        return
    root = Path(str(config.rootpath))

    def rank(item: pytest.Item) -> int:
        path = item.path.relative_to(root).as_posix()
        return next((i for i, prefix in enumerate(SLOW_FIRST) if path.startswith(prefix)), len(SLOW_FIRST))

    items.sort(key=rank)


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    az = Azurite().start()
    os.environ["AzureWebJobsStorage"] = az.connection_string
    yield az
    az.stop()


@pytest.fixture
def env(azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Settings for one test: its own tables, clean queues, a temporary local root."""
    from shared import queues, settings
    from shared.store import reset_store

    values = {
        "AzureWebJobsStorage": azurite.connection_string,
        "TENSORANT_TABLE_PREFIX": "t" + secrets.token_hex(4),
        "TENSORANT_LOCAL_ROOT": str(tmp_path / "local"),
        "TENSORANT_DEPLOYMENT_ID": "test",
        # The local provider's default is the real LoRA trainer; tests run the fast smoke trainer
        # unless they unset this (tests/e2e/test_local_trainer_e2e.py).
        "TENSORANT_TRAINER_COMMAND": f"{sys.executable} -m machine.trainer.smoke",
        # Cloud tests run the test models (tensorant/*) on fake clouds; without this a cloud run refuses
        # them (tests/test_training_api.py checks that refusal with the setting off).
        "TENSORANT_ALLOW_TEST_MODELS": "1",
        # Nothing reaches the real hub: a run naming a Hub model (base_model_revision, e.g. from the schema fuzzer)
        # is refused at the guard (the name does not resolve); tests of it serve tests/hub_fake.py.
        "TENSORANT_HF_ENDPOINT": "https://hub.invalid",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    settings.reset_settings()
    reset_store()
    queues.reset_queues()
    clear_queues(queues.get_queues())
    yield values
    try:
        from shared.store import get_store

        drop_tables(get_store())
    except Exception:
        pass
    settings.reset_settings()
    reset_store()
    queues.reset_queues()


@pytest.fixture
def ctx(env: dict[str, str]) -> Context:
    """The test's invocation context (shared/context.py): the settings, store and queues `env` set up, as the
    edges hand them to a service, a step or a timer that a test calls directly. A test that changes the
    settings after this fixture ran builds a fresh one with `invocation()`."""
    from shared.context import invocation

    return invocation()


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """The in-memory account behind the "memory" provider, installed for one test.

    A module (or class) that needs another MemoryCompute subclass or kind of account overrides this
    fixture with its own, e.g. `yield from serve_memory(ChaosCloud(), ChaosCompute)`: the chaos
    provider's faults (tests/chaos/provider.py), a provider with more offers (tests/test_training_api.py)."""
    from tests.fakes import Cloud, serve_memory

    yield from serve_memory(Cloud())


@pytest.fixture
def harness(env: dict[str, str], cloud: Cloud) -> Iterator[Harness]:
    """A harness with local storage and a connected memory compute connection."""
    from tests.harness import Harness

    harness = Harness()
    harness.save_storage({"kind": "local"})
    conn = harness.save_compute("memory", {})
    assert conn["status"] == "connected", conn
    yield harness
    harness.close()


@pytest.fixture
def calls(harness: Harness) -> Iterator[Calls]:
    """Every call on the store's tables counted, (table, method) -> n (tests/table_calls.py)."""
    from tests.table_calls import counting_calls

    yield from counting_calls()


@pytest.fixture(scope="module")
def module_s3_url() -> Iterator[str]:
    """moto's S3 on a loopback port for one module, with an org's bucket and a RunPod volume's."""
    import boto3

    from tests.storage.moto_s3 import start_moto

    server, url = start_moto()
    s3 = boto3.client("s3", endpoint_url=url, **MOTO_ROOT_KEYS)
    for bucket in (DATA_BUCKET, VOLUME_BUCKET):
        s3.create_bucket(Bucket=bucket)
    yield url
    server.stop()


@pytest.fixture
def fresh_s3_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 for one test, with an empty org bucket; the settings allow its loopback http endpoint."""
    import boto3

    from shared.settings import reset_settings
    from tests.storage.moto_s3 import start_moto

    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")  # moto on loopback http (test-only)
    reset_settings()
    server, url = start_moto()
    s3 = boto3.client("s3", endpoint_url=url, **MOTO_ROOT_KEYS)
    s3.create_bucket(Bucket=DATA_BUCKET)
    yield url
    # moto's objects outlive its server (one in-process backend): leave none to other tests.
    for found in s3.list_objects_v2(Bucket=DATA_BUCKET).get("Contents", []):
        s3.delete_object(Bucket=DATA_BUCKET, Key=found["Key"])
    server.stop()


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    """The control plane's HTTP API faked on loopback, for the CLI's tests."""
    from tests.fake_api import FakeApi

    fake = FakeApi()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture(scope="session")
def moto_ec2_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto in server mode on loopback for the session, its EC2 seeded with the rig's AMIs; its URL."""
    from tests.providers.aws.rig import moto_ec2_server

    with moto_ec2_server(tmp_path_factory.mktemp("moto")) as url:
        yield url


@pytest.fixture(scope="session")
def pricing_server() -> Iterator[PricingServer]:
    """The AWS Pricing API answered from recorded pages, on loopback for the session."""
    from tests.providers.aws.pricing_server import PricingServer

    server = PricingServer().start()
    yield server
    server.stop()


@pytest.fixture
def rig(moto_ec2_url: str, pricing_server: PricingServer) -> Rig:
    """The AWS rig on a freshly reset moto: a VPC, subnet and security group, and a call counter."""
    from tests.providers.aws.rig import new_rig

    return new_rig(moto_ec2_url, pricing_server)


@pytest.fixture
def arm(tmp_path: Path) -> Iterator[FakeArm]:
    """The seeded fake ARM server with the registry's azure provider pointed at it, for tests that
    go through the function app."""
    from tests.providers.azure.rig import route_registry_to, seeded_arm

    fake = seeded_arm(tmp_path)
    undo = route_registry_to(fake)
    yield fake
    undo()
    fake.stop()


@pytest.fixture
def azure_h(env: dict[str, str], arm: FakeArm) -> Iterator[Harness]:
    """A harness with local storage and a connected azure compute connection on the fake ARM."""
    from tests.harness import Harness
    from tests.providers.azure.rig import config_body

    harness = Harness()
    assert harness.save_storage({"kind": "local"})["status"] == "connected"
    conn = harness.save_compute("azure", config_body())
    assert conn["status"] == "connected", conn["checks"]
    yield harness
    harness.close()


@pytest.fixture
def local_host(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHost]:
    """A started dev host on the local provider, running the smoke trainer."""
    from tests.e2e.local_host import start_local_host

    yield from start_local_host(monkeypatch, f"{sys.executable} -m machine.trainer.smoke")
