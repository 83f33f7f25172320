"""The catalog cache (shared/services/catalog.py) that every provider's offers() feeds.

The provider is a hand-written stand-in (offers() returns a list, then raises the
error a price-source outage produces): the rule under test is the cache's, not a
vendor's. The store is the real Azurite-backed one.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared import clock
from shared.models import GpuOffer
from shared.providers.errors import RetryableError

OFFER = GpuOffer(provider="aws", offer_id="us-east-1/us-east-1a/g6.xlarge", gpu="NVIDIA L4", gpu_memory_gb=22.4,
                 machine_type="g6.xlarge", region="us-east-1", zone="us-east-1a", compute_per_hour=0.8048,
                 disk_per_hour=0.0126, total_per_hour=0.8174)


class _Provider:
    def __init__(self) -> None:
        self.fail = False

    def offers(self) -> list[GpuOffer]:
        if self.fail:
            raise RetryableError("the Pricing API could not be reached", code="network")
        return [OFFER]


def test_failed_refresh_serves_the_last_good_copy_with_its_time(env: dict[str, str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.services import catalog

    provider = _Provider()
    monkeypatch.setattr(catalog, "compute_for", lambda org, name: provider)
    first_at = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    clock.set_clock(lambda: first_at.timestamp())
    try:
        good = catalog.refresh("org-1", "aws")
        assert [o.offer_id for o in good.offers] == [OFFER.offer_id] and good.fetched_at == first_at
        assert good.last_error == ""

        provider.fail = True
        clock.set_clock(lambda: (first_at + timedelta(hours=1)).timestamp())
        kept = catalog.refresh("org-1", "aws")
    finally:
        clock.set_clock(None)
    assert [o.offer_id for o in kept.offers] == [OFFER.offer_id]  # the last good copy
    assert kept.fetched_at == first_at  # with the time it was fetched, not the failed attempt's
    assert "Pricing API" in kept.last_error and kept.last_error_at == first_at + timedelta(hours=1)
    stored: Any = catalog.get_store().get_catalog("org-1", "aws")
    assert stored is not None and [o.offer_id for o in stored.offers] == [OFFER.offer_id]
    assert catalog.find_offer("org-1", "aws", OFFER.offer_id).total_per_hour == OFFER.total_per_hour
