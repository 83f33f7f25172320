"""The storage tests talk to moto on loopback http: they run under the explicit test-only
allowance TENSORANT_ALLOW_PRIVATE_ENDPOINTS=1 (production refuses to start with it).
The SSRF tests (test_s3_ssrf.py) turn it off again to show what production does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def allow_loopback_endpoints(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from shared.settings import reset_settings

    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")
    reset_settings()
    yield
    monkeypatch.delenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS")
    reset_settings()
