"""On-demand prices from the AWS Pricing API (GetProducts), which answers only in
client.PRICING_REGION (us-east-1).

Queries are filtered (service, region, OS, tenancy, pre-installed software, capacity
status, and the instance types asked for) and paginated; only the OnDemand term of
each product is read, never Reserved or Spot.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shared.errors import ProviderError
from shared.models import GpuOffer
from shared.providers.aws.catalog import GpuType
from shared.providers.aws.client import AwsClient

HOURS_PER_MONTH = 730  # AWS's own convention for turning a monthly rate into an hourly one
TYPES_PER_QUERY = 20  # ANY_OF values are one comma-separated string; keep it short

# (ServiceCode, filters, page key) -> iterator of PriceList items (JSON strings)
Pager = Callable[[dict[str, Any]], Iterable[str]]


def _term(field: str, value: str, kind: str = "TERM_MATCH") -> dict[str, str]:
    return {"Type": kind, "Field": field, "Value": value}


def compute_query(region: str, instance_types: list[str]) -> dict[str, Any]:
    return {
        "ServiceCode": "AmazonEC2",
        "FormatVersion": "aws_v1",
        "Filters": [
            _term("regionCode", region),
            _term("operatingSystem", "Linux"),
            _term("tenancy", "Shared"),
            _term("preInstalledSw", "NA"),
            _term("capacitystatus", "Used"),
            _term("instanceType", ",".join(instance_types), "ANY_OF"),
        ],
    }


def gp3_query(region: str) -> dict[str, Any]:
    return {
        "ServiceCode": "AmazonEC2",
        "FormatVersion": "aws_v1",
        "Filters": [
            _term("regionCode", region),
            _term("productFamily", "Storage"),
            _term("volumeApiName", "gp3"),
        ],
    }


def on_demand_usd(item: dict[str, Any], unit: str) -> float | None:
    """The USD price per `unit` from the item's OnDemand term, or None if it has none."""
    terms = (item.get("terms") or {}).get("OnDemand") or {}
    for term in terms.values():
        for dim in (term.get("priceDimensions") or {}).values():
            if dim.get("unit") != unit:
                continue
            usd = (dim.get("pricePerUnit") or {}).get("USD")
            if usd is None:
                continue
            value = float(usd)
            if value > 0:
                return value
    return None


def _items(pages: Iterable[str]) -> Iterator[dict[str, Any]]:
    for raw in pages:
        yield json.loads(raw) if isinstance(raw, str) else raw


def hourly_prices(pager: Pager, region: str, instance_types: list[str]) -> dict[str, float]:
    """instance type -> on-demand Linux USD per hour, for the types AWS prices."""
    out: dict[str, float] = {}
    for i in range(0, len(instance_types), TYPES_PER_QUERY):
        chunk = instance_types[i:i + TYPES_PER_QUERY]
        for item in _items(pager(compute_query(region, chunk))):
            attrs = (item.get("product") or {}).get("attributes") or {}
            itype = attrs.get("instanceType", "")
            if itype not in chunk or attrs.get("regionCode", region) != region:
                continue
            price = on_demand_usd(item, "Hrs")
            if price is not None:
                # Several SKUs can survive the filter; the lowest is the plain on-demand one.
                out[itype] = min(price, out.get(itype, price))
    return out


def gp3_per_gb_month(pager: Pager, region: str) -> float | None:
    for item in _items(pager(gp3_query(region))):
        attrs = (item.get("product") or {}).get("attributes") or {}
        if attrs.get("volumeApiName") != "gp3":
            continue
        price = on_demand_usd(item, "GB-Mo")
        if price is not None:
            return price
    return None


ESTIMATE_NOTE = ("On-demand Linux instance plus gp3 root disk (monthly rate / 730). "
                 "Excludes NAT gateway, data transfer, taxes and account-specific discounts.")


def gpu_offers(pager: Pager, region: str, zone: str, types: list[GpuType], disk_gb: int) -> list[GpuOffer]:
    """Priced offers for `types` in `zone`: on-demand compute plus a gp3 disk of `disk_gb`.

    A type without an on-demand Linux price in the region is not offered; no price at all
    (or no gp3 price) is a ProviderError.
    """
    hourly = hourly_prices(pager, region, [t.instance_type for t in types])
    gb_month = gp3_per_gb_month(pager, region)
    if gb_month is None:
        raise ProviderError(f"the Pricing API returned no gp3 storage price for {region}")
    disk_hour = round(disk_gb * gb_month / HOURS_PER_MONTH, 6)
    offers = []
    for t in types:
        if t.instance_type not in hourly:
            continue  # not priced as on-demand Linux here: not offered
        compute_hour = hourly[t.instance_type]
        offers.append(GpuOffer(
            provider="aws", offer_id=f"{region}/{zone}/{t.instance_type}", gpu=t.gpu,
            gpu_memory_gb=t.gpu_memory_gb, gpu_count=1, machine_type=t.instance_type,
            region=region, zone=zone, compute_per_hour=compute_hour, disk_per_hour=disk_hour,
            total_per_hour=round(compute_hour + disk_hour, 6),
            note=f"{ESTIMATE_NOTE} Disk: {disk_gb} GiB gp3 at ${gb_month}/GB-month."))
    if not offers:
        raise ProviderError(f"no supported GPU type in {zone} has an on-demand Linux price in {region}")
    return offers


def pager(client: AwsClient) -> Pager:
    """GetProducts pages through the client (which sends them to PRICING_REGION)."""
    return lambda query: client.pages("pricing", "get_products", "PriceList", MaxResults=100, **query)
