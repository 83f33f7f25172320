"""The VM sizes Tensorant supports on Azure, and the Premium SSD tiers used to price the OS disk.

Only full single-GPU, x64 sizes with an Ampere-or-newer GPU are listed. Left out on
purpose: fractional A10 sizes (NV6ads/NV12ads/NV18ads_A10_v5 carry 1/6 to 1/2 of a
GPU), multi-GPU sizes (NV72ads_A10_v5, NC48ads/NC96ads_A100_v4, NC80adis_H100_v5,
ND*), T4/V100/K80/P100-era sizes, confidential sizes and ARM sizes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSize:
    name: str  # armSkuName, e.g. Standard_NC24ads_A100_v4
    gpu: str
    gpu_memory_gb: float
    vcpus: int
    memory_gb: float


SUPPORTED: dict[str, GpuSize] = {
    s.name.lower(): s
    for s in (
        GpuSize("Standard_NV36ads_A10_v5", "A10", 24, 36, 440),
        GpuSize("Standard_NV36adms_A10_v5", "A10", 24, 36, 880),
        GpuSize("Standard_NC24ads_A100_v4", "A100", 80, 24, 220),
        GpuSize("Standard_NC40ads_H100_v5", "H100 NVL", 94, 40, 320),
    )
}


def supported(name: str) -> GpuSize | None:
    return SUPPORTED.get(name.lower())


# Regions where at least one of the sizes above is commonly offered (a hint only; the
# connection check asks Azure which sizes this subscription can really use).
KNOWN_GPU_REGIONS = frozenset({
    "eastus", "eastus2", "southcentralus", "westus2", "westus3", "centralus", "northcentralus", "westus",
    "westeurope", "northeurope", "uksouth", "swedencentral", "francecentral", "germanywestcentral",
    "switzerlandnorth", "norwayeast", "polandcentral", "italynorth", "spaincentral", "canadacentral",
    "canadaeast", "japaneast", "koreacentral", "southeastasia", "eastasia", "australiaeast", "centralindia",
    "southindia", "uaenorth", "qatarcentral", "brazilsouth", "southafricanorth",
})

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
