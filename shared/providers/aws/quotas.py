"""AWS preflight: will the region's On-Demand vCPU quota of the instance family hold one more instance?

EC2 limits running On-Demand instances per family in vCPUs per region (Service Quotas, service code
`ec2`): "Running On-Demand G and VT instances" (L-DB2E81BA: g*, gr*, vt*) and "Running On-Demand P
instances" (L-417A185B: p*). A new account's GPU quota is often 0, and RunInstances then answers
VcpuLimitExceeded; reading the quota first lets a run skip that candidate and say why.

Reading it needs `servicequotas:GetServiceQuota`, an optional grant (infra/aws/README.md): without it
preflight knows nothing (None) and the connection check says so once, as a warning, never an error.
The usage side is the region's pending and running instances of the family (ec2:DescribeInstances,
already granted), their vCPUs from DescribeInstanceTypes.
"""

from __future__ import annotations

from typing import Any

from shared.errors import AuthError, ProviderError
from shared.log import get_logger
from shared.providers.aws.client import AwsClient

# quota code -> (quota name as Service Quotas spells it, instance type prefixes it covers)
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "L-DB2E81BA": ("Running On-Demand G and VT instances", ("g", "vt")),
    "L-417A185B": ("Running On-Demand P instances", ("p",)),
}
OPTIONAL_GRANT = ("servicequotas:GetServiceQuota (optional, infra/aws/README.md \"Optional: GPU quota preflight\")")


def quota_code(instance_type: str) -> str | None:
    """The Service Quotas code of the type's On-Demand vCPU quota; None for a family not listed."""
    family = instance_type.split(".", 1)[0].lower()
    for code, (_, prefixes) in FAMILIES.items():
        if family.startswith(prefixes):
            return code
    return None


def quota_value(client: AwsClient, code: str) -> float:
    """The applied quota (vCPUs) in the client's region; raises ProviderError (AuthError when not granted)."""
    got = client.call("service-quotas", "get_service_quota", ServiceCode="ec2", QuotaCode=code,
                      action="reading the EC2 On-Demand vCPU quota")
    return float((got.get("Quota") or {}).get("Value", 0))


def _vcpus(client: AwsClient, types: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in range(0, len(types), 100):  # DescribeInstanceTypes takes at most 100 names
        for info in client.pages("ec2", "describe_instance_types", "InstanceTypes", InstanceTypes=types[i:i + 100]):
            out[str(info["InstanceType"])] = int((info.get("VCpuInfo") or {}).get("DefaultVCpus", 0))
    return out


def used_vcpus(client: AwsClient, code: str) -> tuple[int, list[dict[str, Any]]]:
    """vCPUs of the region's pending and running instances of the quota's family, and those instances."""
    # The family is picked here, not by an `instance-type` wildcard filter: EC2 takes one, but emulators
    # (moto) match filter values exactly, and a family test by prefix is the same either way.
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    instances = [i for r in client.pages("ec2", "describe_instances", "Reservations", Filters=filters)
                 for i in r.get("Instances") or [] if quota_code(str(i.get("InstanceType", ""))) == code]
    sizes = _vcpus(client, sorted({str(i["InstanceType"]) for i in instances})) if instances else {}
    return sum(sizes.get(str(i["InstanceType"]), 0) for i in instances), instances


def preflight(client: AwsClient, instance_type: str, run_tag: tuple[str, str] | None = None) -> str | None:
    """Why one more `instance_type` cannot start under the family's On-Demand vCPU quota, or None
    (it fits, or nothing is known: not granted, a family without such a quota, a read that failed).
    run_tag (tag key, value): an instance carrying it is the run's own, already made: nothing to refuse."""
    code = quota_code(instance_type)
    if code is None:
        return None
    try:
        limit = quota_value(client, code)
        used, instances = used_vcpus(client, code)
        if run_tag and any({"Key": run_tag[0], "Value": run_tag[1]} in (i.get("Tags") or []) for i in instances):
            return None
        needed = _vcpus(client, [instance_type]).get(instance_type, 0)
    except AuthError:
        return None  # the optional grant is absent: the connection check has said so
    except ProviderError as exc:
        get_logger().info("aws preflight: the quota could not be read", extra={"reason": exc.reason[:200]})
        return None
    free = int(limit) - used
    if needed and free < needed:
        name = FAMILIES[code][0]
        return (f"{name} ({code}): {max(free, 0)} of {int(limit)} vCPUs free in {client.region}, {instance_type} "
                f"needs {needed}; request more in Service Quotas -> Amazon EC2 -> {name}, or choose another region "
                "or family")
    return None


def check(client: AwsClient) -> tuple[bool | None, str]:
    """The connection check's line: (True, the quotas) when readable, (None, why) when not (a warning)."""
    shown = []
    try:
        for code, (name, _) in FAMILIES.items():
            shown.append(f"{name} {int(quota_value(client, code))} vCPUs")
    except AuthError:
        return None, (f"GPU quota preflight is off: {OPTIONAL_GRANT} is not granted, so a launch is not checked "
                      f"against the On-Demand vCPU quota in {client.region} first (EC2 still refuses one over it, "
                      "and the run then tries its next candidate). Grant it to skip such candidates at once.")
    except ProviderError as exc:
        return None, f"GPU quota preflight could not read the quotas in {client.region}: {exc.reason}"
    return True, f"On-Demand vCPU quotas in {client.region}: {'; '.join(shown)} (read before each launch)."
