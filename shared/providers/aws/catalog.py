"""Which EC2 instance types Tensorant supports, decided from DescribeInstanceTypes data.

Supported: exactly one whole NVIDIA GPU of the Ampere generation or newer, an x86_64
CPU, and on-demand usage. Everything else (T4/T4g, V100, K80, M60, fractional GPUs,
multi-GPU machines, Graviton) is left out. An unknown GPU name is left out too: the
trainer's compatibility with it is unknown, so the table is an allow-list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# GPU name as DescribeInstanceTypes reports it -> architecture (for the offer label).
SUPPORTED_GPUS: dict[str, str] = {
    "A10G": "Ampere",
    "A10": "Ampere",
    "A100": "Ampere",
    "L4": "Ada Lovelace",
    "L40": "Ada Lovelace",
    "L40S": "Ada Lovelace",
    "H100": "Hopper",
    "H200": "Hopper",
    "B200": "Blackwell",
    "RTX PRO 4500": "Blackwell",
    "RTX PRO Server 6000": "Blackwell",
}


def is_gpu_family(instance_type: str) -> bool:
    """Cheap pre-filter so DescribeInstanceTypes is asked only about G and P families."""
    family = instance_type.split(".", 1)[0]
    return family[:1] in ("g", "p")


@dataclass(frozen=True)
class GpuType:
    instance_type: str
    gpu: str
    gpu_memory_gb: float
    vcpus: int
    memory_gb: float


def supported_type(info: dict[str, Any]) -> GpuType | None:
    """The GPU type if `info` (one DescribeInstanceTypes entry) is supported, else None."""
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    if len(gpus) != 1:
        return None
    gpu = gpus[0]
    if gpu.get("Manufacturer") != "NVIDIA" or int(gpu.get("Count", 0)) != 1:
        return None
    # Fractional GPUs (g6f/gr6f: 1/8 to 1/2 of an L4) report Count 1 and a GpuPartitionSize below 1.
    if float(gpu.get("GpuPartitionSize") or 1) < 1:
        return None
    name = str(gpu.get("Name", ""))
    if name not in SUPPORTED_GPUS:
        return None
    if "x86_64" not in (info.get("ProcessorInfo") or {}).get("SupportedArchitectures", []):
        return None
    usage = info.get("SupportedUsageClasses")
    if usage is not None and "on-demand" not in usage:
        return None
    mib = float((gpu.get("MemoryInfo") or {}).get("SizeInMiB", 0))
    return GpuType(
        instance_type=str(info["InstanceType"]),
        gpu=f"NVIDIA {name}",
        gpu_memory_gb=round(mib / 1024, 1),
        vcpus=int((info.get("VCpuInfo") or {}).get("DefaultVCpus", 0)),
        memory_gb=round(float((info.get("MemoryInfo") or {}).get("SizeInMiB", 0)) / 1024, 1),
    )
