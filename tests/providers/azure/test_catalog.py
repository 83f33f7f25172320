"""The catalog (catalog.py + pricing.py) through AzureCompute.offers, against the fake ARM and Retail Prices."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import ProviderError
from shared.providers.azure.config import AzureConfig
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import config_body, make_compute


def test_offers_supported_sizes_with_linux_on_demand_and_disk_price(fake: FakeArm, compute: Any) -> None:
    offers = {o.machine_type: o for o in compute.offers()}
    # fractional A10, multi-GPU A100, T4 and a size not available to the subscription are left out
    assert set(offers) == {"Standard_NV36ads_A10_v5", "Standard_NC24ads_A100_v4", "Standard_NC40ads_H100_v5"}
    a100 = offers["Standard_NC24ads_A100_v4"]
    assert a100.compute_per_hour == 3.673  # not Spot (0.73), Low Priority (0.9), Windows (4.5) or reserved
    assert a100.disk_per_hour == round(19.71 / 730, 4)  # P10 covers 128 GiB
    assert a100.total_per_hour == round(3.673 + 19.71 / 730, 4)
    assert a100.gpu_memory_gb == 80 and a100.region == "eastus"
    assert "network" in a100.note and "taxes" in a100.note and "discounts" in a100.note
    # the VM price query was filtered and followed NextPageLink (page size 3 < matching items)
    vm_queries = [q for q in fake.price_queries if "Virtual Machines" in q]
    assert len(vm_queries) >= 2 and all("armRegionName eq 'eastus'" in q for q in vm_queries)
    assert any("skuName eq 'P10 LRS'" in q for q in fake.price_queries)


def test_prices_are_the_primary_meter_regions(fake: FakeArm, compute: Any) -> None:
    # The Retail Prices API also lists a size's meters from secondary regions (isPrimaryMeterRegion false),
    # at other prices; the catalog asks for the primary ones only (meterRegion='primary').
    from tests.providers.azure.rig import _vm_price

    fake.price_items = [*fake.price_items, {**_vm_price("Standard_NC24ads_A100_v4", 1.1), "isPrimaryMeterRegion": False}]
    offers = {o.machine_type: o for o in compute.offers()}
    assert offers["Standard_NC24ads_A100_v4"].compute_per_hour == 3.673  # not the secondary meter's 1.1


def test_offers_need_a_price(fake: FakeArm, compute: Any) -> None:
    fake.price_items = [p for p in fake.price_items if p["armSkuName"] != "Standard_NC40ads_H100_v5"]
    assert "Standard_NC40ads_H100_v5" not in {o.machine_type for o in compute.offers()}


def test_offers_raise_when_prices_cannot_load(fake: FakeArm) -> None:
    compute = make_compute(fake, prices_url="https://127.0.0.1:1/api/retail/prices")
    with pytest.raises(ProviderError):
        compute.offers()
    fake.price_items = [p for p in fake.price_items if p["serviceName"] != "Storage"]
    with pytest.raises(ProviderError, match="P10"):
        make_compute(fake).offers()


def test_bigger_disk_uses_bigger_tier(fake: FakeArm) -> None:
    cfg = AzureConfig(**config_body(os_disk_gb=200))
    offers = make_compute(fake, config=cfg).offers()
    assert offers and all(o.disk_per_hour == round(38.01 / 730, 4) for o in offers)
