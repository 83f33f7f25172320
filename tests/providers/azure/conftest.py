"""The Azure adapter's own fixtures: a seeded fake ARM server and an AzureCompute whose real SDK
clients talk to it. The rig behind them is tests/providers/azure/rig.py; the fixtures that route
the function app to a fake ARM (`arm`, `azure_h`) are shared with other folders, in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from shared import clock
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import make_compute, seeded_arm
from tests.support.clock import FakeClock

if TYPE_CHECKING:
    from shared.providers.azure.compute import AzureCompute


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeArm]:
    arm = seeded_arm(tmp_path)
    yield arm
    arm.stop()


@pytest.fixture
def compute(fake: FakeArm) -> AzureCompute:
    return make_compute(fake)


@pytest.fixture
def sim_clock() -> Iterator[FakeClock]:
    """The simulated clock, for the core and the fake alike (an operation's time, a NIC's reservation)."""
    fake_clock = FakeClock()
    clock.set_clock(fake_clock)
    yield fake_clock
    clock.set_clock(None)
