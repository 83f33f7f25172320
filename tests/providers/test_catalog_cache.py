"""The catalog cache (written by shared/services/steps/refresh_catalog.py, read by shared/services/api/
catalog.py) that every provider's offers() feeds.

The provider is the memory provider with a price source that goes down when its account says
so (offers() returns a list, then raises the error a price-source outage produces): the rule
under test is the cache's, not a vendor's. The store is the real Azurite-backed one, the
connection a saved one (the `harness` harness).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from shared import clock
from shared.context import Context
from shared.errors import RetryableError
from shared.models import GpuOffer
from tests.fakes import Cloud, MemoryCompute, serve_memory
from tests.harness import Harness

OFFER = GpuOffer(provider="memory", offer_id="us-east-1/us-east-1a/g6.xlarge", gpu="NVIDIA L4", gpu_memory_gb=22.4,
                 machine_type="g6.xlarge", region="us-east-1", zone="us-east-1a", compute_per_hour=0.8048,
                 disk_per_hour=0.0126, total_per_hour=0.8174)


class _Account(Cloud):
    prices_down = False


class _PriceOutage(MemoryCompute):
    def offers(self) -> list[GpuOffer]:
        assert isinstance(self.cloud, _Account)
        if self.cloud.prices_down:
            raise RetryableError("the Pricing API could not be reached", code="network")
        return [OFFER]


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """The memory provider on an account whose Pricing API can be down (`prices_down`)."""
    yield from serve_memory(_Account(), _PriceOutage)


def test_failed_refresh_serves_the_last_good_copy_with_its_time(harness: Harness, cloud: Cloud, ctx: Context) -> None:
    from shared.runs.admission import find_offer
    from shared.services.steps import refresh_catalog as catalog

    assert isinstance(cloud, _Account)
    first_at = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    clock.set_clock(lambda: first_at.timestamp())
    try:
        good = catalog.refresh(ctx, harness.org, "memory")
        assert [o.offer_id for o in good.offers] == [OFFER.offer_id] and good.fetched_at == first_at
        assert good.last_error == ""

        cloud.prices_down = True
        clock.set_clock(lambda: (first_at + timedelta(hours=1)).timestamp())
        kept = catalog.refresh(ctx, harness.org, "memory")
    finally:
        clock.set_clock(None)
    assert [o.offer_id for o in kept.offers] == [OFFER.offer_id]  # the last good copy
    assert kept.fetched_at == first_at  # with the time it was fetched, not the failed attempt's
    assert "Pricing API" in kept.last_error and kept.last_error_at == first_at + timedelta(hours=1)
    stored = ctx.store.catalogs.get(harness.org, "memory")
    assert stored is not None and [o.offer_id for o in stored.offers] == [OFFER.offer_id]
    assert find_offer(ctx, harness.org, "memory", OFFER.offer_id).total_per_hour == OFFER.total_per_hour
