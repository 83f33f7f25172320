"""On-demand prices from the public Azure Retail Prices API (no credentials needed).

Queries are filtered by service, region and SKU (an unfiltered walk is ~150 pages and
takes minutes) and follow NextPageLink up to a bound. The estimate is the Linux
pay-as-you-go VM price plus the Premium SSD OS disk's monthly price / 730; Spot and
Low Priority meters and Windows products are excluded. Network, transfer, taxes and
discounts are not part of it. The Premium SSD tier table (what a disk size is billed as)
lives here too: the connection's warnings and the offers' disk price both use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.errors import ProviderError, RetryableError
from shared.providers.azure import sdk

RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
HOURS_PER_MONTH = 730
MAX_PAGES = 20  # a filtered query is one or two pages; the bound stops a runaway walk
PRICE_NOTE = ("On-demand Linux VM price plus the Premium SSD OS disk's monthly price / 730, from the Azure Retail "
              "Prices API; network services, data transfer, taxes and discounts are not included.")

# Premium SSD managed disk tiers: (tier, size in GiB). A disk is billed as the smallest tier that holds it.
PREMIUM_TIERS: tuple[tuple[str, int], ...] = (
    ("P1", 4), ("P2", 8), ("P3", 16), ("P4", 32), ("P6", 64), ("P10", 128), ("P15", 256), ("P20", 512),
    ("P30", 1024), ("P40", 2048), ("P50", 4096), ("P60", 8192), ("P70", 16384), ("P80", 32767),
)


def disk_tier(size_gb: int) -> tuple[str, int]:
    for tier, size in PREMIUM_TIERS:
        if size_gb <= size:
            return tier, size
    raise ValueError(f"{size_gb} GiB is larger than any Premium SSD tier")


@dataclass(frozen=True)
class DiskPrice:
    tier: str
    size_gb: int
    per_month: float

    @property
    def per_hour(self) -> float:
        return self.per_month / HOURS_PER_MONTH


class RetailPrices:
    """The Retail Prices API client (plain HTTPS via requests, imported lazily; no credentials)."""

    def __init__(self, base_url: str = RETAIL_PRICES_URL, *, verify: bool | str = True, timeout_s: float = 20.0,
                 currency: str = "USD") -> None:
        self.base_url = base_url
        self.verify = verify
        self.timeout_s = timeout_s
        self.currency = currency

    def _items(self, odata_filter: str) -> list[dict[str, Any]]:
        requests = sdk.requests

        url: str | None = self.base_url
        # meterRegion='primary': each meter once, from its primary region (without it the API also returns
        # the meters of secondary regions, whose prices are not what a VM in this region is billed).
        params: dict[str, str] | None = {"currencyCode": self.currency, "meterRegion": "'primary'",
                                         "$filter": odata_filter}
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
