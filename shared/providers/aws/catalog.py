"""Which EC2 instance types Tensorant supports, decided from DescribeInstanceTypes data.

Supported: exactly one whole NVIDIA GPU of the Ampere generation or newer, an x86_64
CPU, and on-demand usage. Everything else (T4/T4g, V100, K80, M60, fractional GPUs,
multi-GPU machines, Graviton) is left out. An unknown GPU name is left out too: the
trainer's compatibility with it is unknown, so the table is an allow-list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.errors import PermanentError
from shared.providers.aws.client import AwsClient

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


# ---------------------------------------------------------------- lookups in the account


def image(client: AwsClient, ami_id: str) -> dict[str, Any]:
    """The AMI (DescribeImages); PermanentError when it does not exist in the region."""
    images = client.call("ec2", "describe_images", ImageIds=[ami_id], action="reading the AMI").get("Images") or []
    if not images:
        raise PermanentError(f"AMI {ami_id} was not found in {client.region}; "
                             "paste an AMI ID from this region or copy the image here.")
    found: dict[str, Any] = images[0]
    return found


def root_size_gb(image: dict[str, Any]) -> int:
    """The AMI's root volume size; the workspace is added to it."""
    root = image.get("RootDeviceName")
    for m in image.get("BlockDeviceMappings") or []:
        if m.get("DeviceName") == root and m.get("Ebs", {}).get("VolumeSize"):
            return int(m["Ebs"]["VolumeSize"])
    return 8  # AWS's smallest common root size; only used when the image does not say


def subnet(client: AwsClient, subnet_id: str) -> dict[str, Any]:
    """The subnet (DescribeSubnets); PermanentError when it does not exist in the region."""
    subnets = client.call("ec2", "describe_subnets", SubnetIds=[subnet_id],
                          action="reading the subnet").get("Subnets") or []
    if not subnets:
        raise PermanentError(f"subnet {subnet_id} was not found in {client.region}")
    found: dict[str, Any] = subnets[0]
    return found


def gpu_types(client: AwsClient, zone: str) -> list[GpuType]:
    """The supported GPU types offered in `zone`, by instance type."""
    offered = [o["InstanceType"] for o in client.pages(
        "ec2", "describe_instance_type_offerings", "InstanceTypeOfferings",
        LocationType="availability-zone", Filters=[{"Name": "location", "Values": [zone]}])]
    candidates = sorted({t for t in offered if is_gpu_family(t)})
    found: list[GpuType] = []
    for i in range(0, len(candidates), 100):  # DescribeInstanceTypes takes at most 100 names
        for info in client.pages("ec2", "describe_instance_types", "InstanceTypes",
                                 InstanceTypes=candidates[i:i + 100]):
            t = supported_type(info)
            if t is not None:
                found.append(t)
    return sorted(found, key=lambda t: t.instance_type)
