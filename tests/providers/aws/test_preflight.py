"""preflight(): the region's On-Demand vCPU quota of the instance's family (Service Quotas'
GetServiceQuota, answered by the rig's fake in its real shape since moto serves no EC2 quota) against
the family's pending and running instances on moto; the optional grant refused is a warning at the
check and nothing at launch."""

from __future__ import annotations

from typing import Any

from shared.models import CheckStatus, GpuOffer
from shared.providers.base import RunRef
from tests.providers.aws.rig import AMI_GOOD, REGION, ZONE, Rig


def _offer(instance_type: str, region: str = REGION) -> GpuOffer:
    return GpuOffer(provider="aws", offer_id=f"{region}/{ZONE}/{instance_type}", gpu="L4", gpu_memory_gb=24,
                    machine_type=instance_type, region=region, compute_per_hour=1.0, disk_per_hour=0.01,
                    total_per_hour=1.01)


def _running(rig: Rig, instance_type: str, run_id: str = "") -> str:
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "tensorant:run", "Value": run_id}]}] if run_id else []
    got = rig.ec2.run_instances(ImageId=AMI_GOOD, InstanceType=instance_type, MinCount=1, MaxCount=1,
                                SubnetId=rig.subnet_id, TagSpecifications=tags)
    return str(got["Instances"][0]["InstanceId"])


def _quota_calls(rig: Rig) -> list[tuple[str, str]]:
    return [c for c in rig.log.take() if c[0] == "servicequotas"]


def test_a_family_with_no_quota_is_refused_with_the_figures(rig: Rig) -> None:
    rig.quotas = {"L-DB2E81BA": 0.0, "L-417A185B": 96.0}
    compute = rig.compute()
    why = compute.preflight(_offer("g6.xlarge"))
    assert why is not None
    assert "Running On-Demand G and VT instances (L-DB2E81BA): 0 of 0 vCPUs free in us-east-1" in why
    assert "g6.xlarge needs 4" in why and "Service Quotas" in why
    assert compute.preflight(_offer("p5.4xlarge")) is None  # the P family has room for its 16 vCPUs
    assert _quota_calls(rig) == [("servicequotas", "GetServiceQuota")] * 2


def test_running_instances_of_the_family_use_the_quota(rig: Rig) -> None:
    rig.quotas = {"L-DB2E81BA": 8.0, "L-417A185B": 0.0}
    compute = rig.compute()
    assert compute.preflight(_offer("g6.2xlarge")) is None  # 8 vCPUs of 8 free
    _running(rig, "g5.xlarge")  # 4 vCPUs of the G family now in use
    _running(rig, "m5.large")  # another family's instance counts for nothing here
    why = compute.preflight(_offer("g6.2xlarge"))
    assert why is not None and "4 of 8 vCPUs free" in why and "g6.2xlarge needs 8" in why
    assert compute.preflight(_offer("g6.xlarge")) is None  # 4 fit in 4


def test_the_runs_own_instance_is_never_a_reason(rig: Rig) -> None:
    rig.quotas = {"L-DB2E81BA": 4.0, "L-417A185B": 0.0}
    compute = rig.compute()
    _running(rig, "g6.xlarge", run_id="run-own")
    assert compute.preflight(_offer("g6.xlarge")) is not None  # for any other run: no room left
    assert compute.preflight(_offer("g6.xlarge"), RunRef("test", "org1", "run-own")) is None


def test_without_the_optional_grant_nothing_is_known_and_the_check_warns(rig: Rig) -> None:
    rig.quotas = None  # IAM refuses servicequotas:GetServiceQuota
    compute = rig.compute()
    assert compute.preflight(_offer("g6.xlarge")) is None
    checks: dict[str, Any] = {c.name: c for c in compute.validate()}
    quota = checks["quota_preflight"]
    assert quota.status == CheckStatus.warn and "servicequotas:GetServiceQuota" in quota.message
    assert "infra/aws/README.md" in quota.message
    assert not [c for c in checks.values() if c.status == CheckStatus.fail]  # never an error


def test_with_the_grant_the_check_shows_the_quotas(rig: Rig) -> None:
    rig.quotas = {"L-DB2E81BA": 32.0, "L-417A185B": 0.0}
    quota = {c.name: c for c in rig.compute().validate()}["quota_preflight"]
    assert quota.status == CheckStatus.ok
    assert "Running On-Demand G and VT instances 32 vCPUs" in quota.message
    assert "Running On-Demand P instances 0 vCPUs" in quota.message


def test_an_offer_without_a_listed_family_or_of_another_region_is_not_judged(rig: Rig) -> None:
    rig.quotas = {"L-DB2E81BA": 0.0, "L-417A185B": 0.0}
    compute = rig.compute()
    assert compute.preflight(_offer("m5.large")) is None
    assert compute.preflight(_offer("g6.xlarge", region="us-west-2")) is None
    assert _quota_calls(rig) == []
