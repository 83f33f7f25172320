"""The Azure catalog: the VM sizes Tensorant supports, which of them this subscription may use
in the region (Resource SKUs and their restrictions), and the priced offers.

Only full single-GPU, x64 sizes with an Ampere-or-newer GPU are listed. Left out on
purpose: fractional A10 sizes (NV6ads/NV12ads/NV18ads_A10_v5 carry 1/6 to 1/2 of a
GPU), multi-GPU sizes (NV72ads_A10_v5, NC48ads/NC96ads_A100_v4, NC80adis_H100_v5,
ND*), T4/V100/K80/P100-era sizes, confidential sizes and ARM sizes. A size is offered only
when Azure lists it for the subscription in the region AND the Retail Prices API prices it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.models import GpuOffer
from shared.providers.azure.client import AzureClient, as_dict, dig, region_code
from shared.providers.azure.pricing import PRICE_NOTE, RetailPrices


@dataclass(frozen=True)
class GpuSize:
    name: str  # armSkuName, e.g. Standard_NC24ads_A100_v4
    gpu: str
    gpu_memory_gb: float
    vcpus: int
    memory_gb: float
    # Its quota family as compute usages name it (the Resource SKU's `family`), for preflight.
    family: str = ""


SUPPORTED: dict[str, GpuSize] = {
    s.name.lower(): s
    for s in (
        GpuSize("Standard_NV36ads_A10_v5", "A10", 24, 36, 440, "standardNVADSA10v5Family"),
        GpuSize("Standard_NV36adms_A10_v5", "A10", 24, 36, 880, "standardNVADSA10v5Family"),
        GpuSize("Standard_NC24ads_A100_v4", "A100", 80, 24, 220, "StandardNCADSA100v4Family"),
        GpuSize("Standard_NC40ads_H100_v5", "H100 NVL", 94, 40, 320, "standardNCadsH100v5Family"),
    )
}


def supported(name: str) -> GpuSize | None:
    return SUPPORTED.get(name.lower())


@dataclass(frozen=True)
class AvailableSize:
    """A supported size this subscription may use in the region, with its quota family."""

    size: GpuSize
    family: str  # the quota family, e.g. StandardNCADSA100v4Family
    vcpus: int
    accelerated_networking: bool = False  # the SKU's AcceleratedNetworkingEnabled capability

    @property
    def name(self) -> str:
        return self.size.name


def available_sizes(client: AzureClient, region: str) -> tuple[dict[str, AvailableSize], dict[str, str]]:
    """(lower-case name -> available size, size name -> why it is not available) from Resource SKUs."""
    skus = client.call("listing VM sizes (resource SKUs)", lambda: [
        as_dict(s) for s in client.compute().resource_skus.list(filter=f"location eq '{region}'")])
    available: dict[str, AvailableSize] = {}
    unavailable: dict[str, str] = {}
    for sku in skus:
        size = supported(str(sku.get("name", "")))
        if size is None or sku.get("resourceType") != "virtualMachines":
            continue
        if region not in {region_code(str(loc)) for loc in sku.get("locations") or []}:
            continue
        caps = {str(c.get("name")): str(c.get("value")) for c in sku.get("capabilities") or []}
        if caps.get("GPUs", "1") != "1" or caps.get("CpuArchitectureType", "x64") != "x64":
            continue  # the table says single-GPU x64; the SKU's own record must agree
        if "V2" not in caps.get("HyperVGenerations", "V2"):
            unavailable[size.name] = "no Gen2 support"
            continue
        zones = set()
        for info in sku.get("locationInfo") or []:
            if region_code(str(info.get("location", ""))) == region:
                zones |= set(info.get("zones") or [])
        reason = ""
        for r in sku.get("restrictions") or []:
            why = str(r.get("reasonCode", "restricted"))
            if r.get("type") == "Location" and region in {region_code(str(v)) for v in r.get("values") or []}:
                reason = why
            elif r.get("type") == "Zone":
                blocked = set(dig(r, "restrictionInfo", "zones", default=[]) or [])
                if zones and zones <= blocked:
                    reason = f"{why} in every zone"
        if reason:
            unavailable[size.name] = reason
            continue
        available[size.name.lower()] = AvailableSize(size=size, family=str(sku.get("family", "")),
                                                     vcpus=int(caps.get("vCPUs", size.vcpus)),
                                                     accelerated_networking=caps.get(
                                                         "AcceleratedNetworkingEnabled", "False").lower() == "true")
    return available, unavailable


def offers(client: AzureClient, prices: RetailPrices, region: str, os_disk_gb: int) -> list[GpuOffer]:
    """One offer per available, priced size: compute + OS disk per hour (no price, no offer)."""
    available, _ = available_sizes(client, region)
    if not available:
        return []
    hourly = prices.vm_hourly(region, [s.name for s in available.values()])
    disk = prices.os_disk(region, os_disk_gb)
    out = []
    for key, s in sorted(available.items()):
        if key not in hourly:
            continue  # no price, no offer: an estimate must never be blank
        size = s.size
        compute = round(hourly[key], 4)
        disk_h = round(disk.per_hour, 4)
        out.append(GpuOffer(
            provider="azure", offer_id=f"azure:{region}:{size.name}", gpu=size.gpu,
            gpu_memory_gb=size.gpu_memory_gb, machine_type=size.name, region=region,
            compute_per_hour=compute, disk_per_hour=disk_h, total_per_hour=round(compute + disk_h, 4),
            note=f"{PRICE_NOTE} OS disk: Premium SSD {disk.tier} ({disk.size_gb} GiB).",
        ))
    return out


def quota_shortfall(usages: list[dict[str, Any]], size: GpuSize, region: str) -> str | None:
    """Why one more VM of `size` does not fit the compute usages of `region` (Usage - List: each item's
    name.value is a quota family or `cores`, the Total Regional vCPUs), or None (it fits, or the usages
    do not name its family: nothing known). Names are compared without case, as Azure's vary."""
    by_name = {str(dig(u, "name", "value", default="")).lower(): u for u in usages}
    for key in (size.family.lower(), "cores"):
        u = by_name.get(key)
        if u is None:
            if key != "cores":
                return None  # the family is not listed: nothing to compare
            continue
        limit, current = int(u.get("limit", 0)), int(u.get("currentValue", 0))
        free = limit - current
        if free < size.vcpus:
            label = str(dig(u, "name", "localizedValue", default="")) or (
                "Total Regional vCPUs" if key == "cores" else f"{size.family} vCPUs")
            return (f"{label}: {max(free, 0)} of {limit} free in {region}, {size.name} needs {size.vcpus}; request "
                    "more in Subscriptions -> Usage + quotas (quota approval does not reserve capacity), or choose "
                    "another region or size")
    return None
