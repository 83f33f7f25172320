"""The client's call discipline (client.py): 429 handling with bounded inline retries."""

from __future__ import annotations

import pytest

from shared.errors import ThrottledError
from shared.models import MachineState
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import REF, make_compute


def test_throttling_honours_retry_after(fake: FakeArm) -> None:
    slept: list[float] = []
    fake.fail("GET", r"/virtualmachines/tensorant-test-run-abc$", 429, "TooManyRequests", times=2,
              headers={"Retry-After": "3"})
    compute = make_compute(fake, sleep=slept.append)
    assert compute.describe(REF, []).state == MachineState.gone
    assert slept == [3.0, 3.0]
    fake.fail("GET", r"/virtualmachines/tensorant-test-run-abc$", 429, "TooManyRequests", times=5,
              headers={"Retry-After": "120"})
    with pytest.raises(ThrottledError) as info:
        compute.describe(REF, [])
    assert info.value.retry_after_s == 120.0


def test_sdk_does_not_sleep_out_long_retry_after(fake: FakeArm) -> None:
    """With production retry settings the SDK must not wait out a long Retry-After itself."""
    import time

    fake.fail("GET", r"/virtualmachines/tensorant-test-run-abc$", 429, "TooManyRequests", times=5,
              headers={"Retry-After": "120"})
    compute = make_compute(fake, retry_total=3)
    started = time.monotonic()
    with pytest.raises(ThrottledError):
        compute.describe(REF, [])
    assert time.monotonic() - started < 10
    assert sum(1 for m, p, _, _ in fake.requests if m == "GET" and p.endswith("/tensorant-test-run-abc")) == 1
