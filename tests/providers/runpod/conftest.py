"""The fake RunPod GraphQL server on loopback, which the adapter's tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.providers.runpod.fake_server import FakeRunPod
from tests.providers.runpod.rig import KEY


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunPod]:
    server = FakeRunPod(api_key=KEY).start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", server.url)
    yield server
    server.stop()
