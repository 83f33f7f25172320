"""Which RunPod GPU types Tensorant offers (an allow-list), and the offers built from the
gpuTypes answer with their prices."""

from __future__ import annotations

import re
from typing import Any

from shared.models import GpuOffer
from shared.providers.runpod import pricing

PROVIDER = "runpod"

# Ampere or newer, NVIDIA only (allow-list: an unknown GPU stays out of the catalog).
# GeForce RTX x050-x090 only: "Quadro RTX 4000/5000" are Turing (RTX 4000/5000 *Ada* match \bAda\b).
_SUPPORTED = re.compile(
    r"\bA(2|10|10G|16|30|40|100)\b|\bA[2-6]\d{3}\b|\bRTX (30|40|50)[5-9]0\b|\bL4\b|\bL40S?\b"
    r"|\bG?H(100|200)\b|\bG?B(100|200|300)\b|\bAda\b|\bBlackwell\b",
)
_NOT_NVIDIA = re.compile(r"\bAMD\b|\bInstinct\b|\bMI\d{3}", re.I)
EXCLUDED_NOTE = ("T4, V100, P100, RTX 20xx and other pre-Ampere or non-NVIDIA GPUs are not offered "
                 "(the trainer needs Ampere or newer)")

# The training image needs a host driver for CUDA MIN_CUDA or newer. RunPod places a pod, and prices
# and stocks a GPU, on hosts whose driver reports this CUDA version or newer when asked with
# `minCudaVersion` (a field of the pod create's input and of lowestPrice's: dstack and gpuhunt send
# it), so a version RunPod reports after this was written is included. The exact list
# (allowedCudaVersions) turned down every host newer than the list, and lowestPrice does not define it.
MIN_CUDA = "13.0"


def is_supported_gpu(gpu_id: str, display: str = "") -> bool:
    text = f"{gpu_id} {display}"
    return bool(_SUPPORTED.search(text)) and not _NOT_NVIDIA.search(text)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def gpu_offers(gpu_types: list[dict[str, Any]], *, cloud: str, dc: str | None, disk_gb: int) -> list[GpuOffer]:
    """Priced single-GPU offers from RunPod's gpuTypes answer, cheapest first. lowestPrice was asked for
    one GPU on hosts of the cloud type (and the volume's datacenter) with CUDA MIN_CUDA or newer
    (client.offers_input): a GPU it reports no stock for has no host a pod of the run could be placed
    on, with or without a datacenter, and is left out."""
    disk_per_hour = pricing.disk_per_hour(disk_gb)
    note = (f"Single GPU. {EXCLUDED_NOTE}. Listed while RunPod has it in stock on a host with CUDA {MIN_CUDA} or "
            f"newer. Disk: {disk_gb} GB of container disk and pod volume.")
    if dc:
        note += f" Only GPUs in the network volume's datacenter {dc}; the volume is billed separately."
    offers: list[GpuOffer] = []
    for gpu in gpu_types:
        gpu_id = str(gpu.get("id") or "")
        if not gpu_id or not is_supported_gpu(gpu_id, str(gpu.get("displayName") or "")):
            continue
        lowest = gpu.get("lowestPrice") or {}
        if not lowest.get("stockStatus"):
            continue  # no host in stock with the CUDA minimum (in the volume's datacenter, when there is one)
        offered = {"SECURE": gpu.get("secureCloud"), "COMMUNITY": gpu.get("communityCloud")}.get(cloud, True)
        if not offered:
            continue
        price = lowest.get("uninterruptablePrice") or (
            gpu.get("communityPrice") if cloud == "COMMUNITY" else gpu.get("securePrice"))
        if not price or float(price) <= 0:
            continue
        compute = round(float(price), 4)
        offers.append(GpuOffer(
            provider=PROVIDER,
            offer_id=f"runpod-{slug(cloud)}-{slug(dc or 'any')}-{slug(gpu_id)}",
            gpu=str(gpu.get("displayName") or gpu_id),
            gpu_memory_gb=float(gpu.get("memoryInGb") or 0),
            machine_type=gpu_id,
            region=dc or "any",
            compute_per_hour=compute,
            disk_per_hour=disk_per_hour,
            total_per_hour=round(compute + disk_per_hour, 4),
            note=note,
        ))
    return sorted(offers, key=lambda o: (o.total_per_hour, o.gpu))
