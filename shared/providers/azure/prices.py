"""On-demand prices from the public Azure Retail Prices API (no credentials needed).

Queries are filtered by service, region and SKU (an unfiltered walk is ~150 pages and
takes minutes) and follow NextPageLink up to a bound. The estimate is the Linux
pay-as-you-go VM price plus the Premium SSD OS disk's monthly price / 730; Spot and
Low Priority meters and Windows products are excluded. Network, transfer, taxes and
discounts are not part of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.providers.azure.skus import disk_tier
from shared.providers.errors import ProviderError, RetryableError

RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
HOURS_PER_MONTH = 730
MAX_PAGES = 20  # a filtered query is one or two pages; the bound stops a runaway walk
PRICE_NOTE = ("On-demand Linux VM price plus the Premium SSD OS disk's monthly price / 730, from the Azure Retail "
              "Prices API; network services, data transfer, taxes and discounts are not included.")


@dataclass(frozen=True)
class DiskPrice:
    tier: str
    size_gb: int
    per_month: float

    @property
    def per_hour(self) -> float:
        return self.per_month / HOURS_PER_MONTH


class RetailPrices:
    def __init__(self, base_url: str = RETAIL_PRICES_URL, *, verify: bool | str = True, timeout_s: float = 20.0,
                 currency: str = "USD") -> None:
        self.base_url = base_url
        self.verify = verify
        self.timeout_s = timeout_s
        self.currency = currency

    def _items(self, odata_filter: str) -> list[dict[str, Any]]:
        import requests

        url: str | None = self.base_url
        params: dict[str, str] | None = {"currencyCode": self.currency, "$filter": odata_filter}
        items: list[dict[str, Any]] = []
        for _ in range(MAX_PAGES):
            if not url:
                return items
            try:
                resp = requests.get(url, params=params, timeout=self.timeout_s, verify=self.verify)
            except requests.RequestException as e:
                raise RetryableError(f"Azure Retail Prices API unreachable: {type(e).__name__}",
                                     code="PricesUnavailable") from None
            if resp.status_code != 200:
                raise RetryableError(f"Azure Retail Prices API answered {resp.status_code}",
                                     code="PricesUnavailable", retry_after_s=60)
            body = resp.json()
            items.extend(body.get("Items") or [])
            url, params = body.get("NextPageLink"), None  # the next link carries the filter and skip
        raise ProviderError(f"Azure Retail Prices API returned more than {MAX_PAGES} pages for a filtered query",
                            code="PricesUnavailable")

    def vm_hourly(self, region: str, sizes: list[str]) -> dict[str, float]:
        """armSkuName (lower case) -> Linux on-demand $/hour for the sizes that have a price."""
        if not sizes:
            return {}
        names = " or ".join(f"armSkuName eq '{s}'" for s in sizes)
        flt = (f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
               f"and priceType eq 'Consumption' and ({names})")
        out: dict[str, float] = {}
        for it in self._items(flt):
            meter = f"{it.get('meterName', '')} {it.get('skuName', '')}".lower()
            if "spot" in meter or "low priority" in meter:
                continue
            if "windows" in str(it.get("productName", "")).lower():
                continue
            if it.get("unitOfMeasure") != "1 Hour" or it.get("type", "Consumption") != "Consumption":
                continue
            if it.get("armRegionName", region) != region:
                continue
            price = float(it.get("retailPrice") or it.get("unitPrice") or 0)
            if price <= 0:
                continue
            key = str(it.get("armSkuName", "")).lower()
            # Several meters can match (e.g. a legacy one); the lowest Linux pay-as-you-go price is what runs cost.
            out[key] = min(price, out.get(key, price))
        return out

    def os_disk(self, region: str, size_gb: int) -> DiskPrice:
        tier, size = disk_tier(size_gb)
        flt = (f"serviceName eq 'Storage' and armRegionName eq '{region}' and priceType eq 'Consumption' "
               f"and productName eq 'Premium SSD Managed Disks' and skuName eq '{tier} LRS'")
        for it in self._items(flt):
            if it.get("unitOfMeasure") != "1/Month":
                continue
            if not str(it.get("meterName", "")).endswith("Disk"):
                continue  # skip e.g. disk-mount or burst meters
            price = float(it.get("retailPrice") or it.get("unitPrice") or 0)
            if price > 0:
                return DiskPrice(tier, size, price)
        raise ProviderError(f"no Premium SSD {tier} LRS price for {region} in the Azure Retail Prices API",
                            code="PricesUnavailable")
