"""The end-to-end tests' control plane over HTTP: the dev host serving the real function app on a
free port, for the local tests (`api`) and, with queues drained by a Harness and custom S3 storage
on moto, for the machine's bootstrap (`plane`, `boot_aws_h`: tests/e2e/test_bootstrap_e2e.py and
test_image_e2e.py).

A module that runs another trainer says so with an autouse fixture: autouse fixtures are set up
before the ones a test names, so its settings are in place when `api` starts the host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.azurite import free_port
from tests.e2e.local_host import ROOT, Client, release_local_leaks

if TYPE_CHECKING:
    from tensorant_devhost.host import Host
    from tests.e2e.boot import BootHarness
    from tests.providers.aws.rig import Rig
    from tests.providers.azure.fake_arm import FakeArm
    from tests.providers.runpod.fake_server import FakeRunPod


@pytest.fixture
def api(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """The dev host serving function_app (no timers), and a client holding an owner's token."""
    from shared import settings
    from shared.models import Role
    from shared.security import mint_user_token
    from tensorant_devhost.host import Host

    port = free_port()
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", f"http://127.0.0.1:{port}")
    settings.reset_settings()
    import function_app

    host = Host(function_app.app, root=ROOT, port=port, load_settings=False, timers=False).start()
    yield Client(host.url, mint_user_token("owner@a", "org-a", Role.owner))
    host.stop()
    release_local_leaks()


@pytest.fixture
def plane(env: dict[str, str], moto_ec2_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    """The control plane as a machine sees it: the app's HTTP routes on a loopback port (queues are
    drained by the test's Harness, on a simulated clock), custom S3 storage on moto."""
    import function_app
    from shared.settings import reset_settings
    from tensorant_devhost.host import Host

    port = free_port()
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")  # moto listens on loopback http
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_ec2_url)
    reset_settings()
    host = Host(function_app.app, root=ROOT, port=port, load_settings=False, queues=False, timers=False).start()
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture
def boot_aws_h(plane: Host, rig: Rig, monkeypatch: pytest.MonkeyPatch,
               tmp_path: Path) -> Iterator[tuple[BootHarness, Any]]:
    """A BootHarness with a connected aws compute connection on moto, and moto's EC2 client."""
    from tests.e2e.boot import boot_harness

    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", rig.pricing.url)
    h = boot_harness(tmp_path, rig.url)
    conn = h.save_compute("aws", rig.body(workspace_disk_gb=50))
    assert conn["status"] == "connected", conn["checks"]
    ec2 = rig.ec2
    yield h, ec2
    h.close()


@pytest.fixture
def boot_azure_h(plane: Host, moto_ec2_url: str, arm: FakeArm, tmp_path: Path) -> Iterator[BootHarness]:
    """A BootHarness with a connected azure compute connection on the fake ARM."""
    from tests.e2e.boot import boot_harness
    from tests.providers.azure.rig import config_body

    h = boot_harness(tmp_path, moto_ec2_url)
    conn = h.save_compute("azure", config_body())
    assert conn["status"] == "connected", conn["checks"]
    yield h
    h.close()


@pytest.fixture
def boot_runpod_h(plane: Host, moto_ec2_url: str, monkeypatch: pytest.MonkeyPatch,
                  tmp_path: Path) -> Iterator[tuple[BootHarness, FakeRunPod]]:
    """A BootHarness with a connected runpod compute connection on the fake GraphQL server, and that server."""
    from tests.e2e.boot import RUNPOD_KEY, boot_harness
    from tests.providers.runpod.fake_server import FakeRunPod

    fake_rp = FakeRunPod(api_key=RUNPOD_KEY).start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake_rp.url)
    h = boot_harness(tmp_path, moto_ec2_url)
    assert h.save_compute("runpod", {"api_key": RUNPOD_KEY})["status"] == "connected"
    yield h, fake_rp
    h.close()
    fake_rp.stop()
