"""The provider contract suite for AWS, on moto in server mode (tests/providers/contract.py)."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from shared.models import GpuOffer
from shared.providers.base import TAG_DEPLOYMENT, TAG_RUN, Bootstrap, LaunchSpec, RunRef
from tests.providers.aws.refusing_proxy import RefusingProxy
from tests.providers.aws.rig import AMI_GOOD, ZONE, Rig, inject
from tests.providers.contract import CloudContract, Foreign, Handed, ProviderEnv

OFFER = GpuOffer(provider="aws", offer_id=f"us-east-1/{ZONE}/g6.xlarge", gpu="NVIDIA L4", gpu_memory_gb=22.4,
                 machine_type="g6.xlarge", region="us-east-1", zone=ZONE, compute_per_hour=0.8048,
                 disk_per_hour=0.0126, total_per_hour=0.8174)
PAGE = 5  # EC2's smallest MaxResults for DescribeInstances
# The HTTP status EC2 answers each refusal kind with (the EC2 API reference, errors-overview).
STATUS = {"capacity": 500, "quota": 400, "auth": 403, "not_found": 400, "throttled": 503}


def _filters(ref: RunRef) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{TAG_RUN}", "Values": [ref.run_id]},
            {"Name": f"tag:{TAG_DEPLOYMENT}", "Values": [ref.deployment]}]


class TestAwsContract(CloudContract):
    @pytest.fixture
    def provider_env(self, rig: Rig) -> Iterator[ProviderEnv]:
        ec2 = rig.ec2

        def spec(ref: RunRef) -> LaunchSpec:
            boot = Bootstrap(container_image="ghcr.io/tensorant/trainer:2026.11",
                             env={"TENSORANT_RUN_ID": ref.run_id, "TENSORANT_RUN_TOKEN": "tok-contract-aws",
                                  "TENSORANT_API_URL": "https://cp.example.com"},
                             secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"}))
            return LaunchSpec(ref=ref, offer=OFFER, bootstrap=boot)

        def machines(ref: RunRef) -> list[str]:
            found = ec2.describe_instances(Filters=_filters(ref))["Reservations"]
            return sorted(i["InstanceId"] for r in found for i in r["Instances"] if i["State"]["Name"] != "terminated")

        def disks(ref: RunRef) -> list[str]:
            return sorted(v["VolumeId"] for v in ec2.describe_volumes(Filters=_filters(ref))["Volumes"])

        def everything() -> dict[str, str]:
            out = {i["InstanceId"]: i["State"]["Name"]
                   for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
            out.update({v["VolumeId"]: v["State"] for v in ec2.describe_volumes()["Volumes"]})
            return out

        def add_foreign(kind: Foreign, ref: RunRef) -> list[str]:
            tags = {"Name": ref.name}  # unmarked, but the run's very name
            if kind == "other-deployment":
                tags |= RunRef(ref.deployment + "x", ref.org, ref.run_id).tags
            tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
            inst = ec2.run_instances(
                ImageId=AMI_GOOD, InstanceType="g6.xlarge", MinCount=1, MaxCount=1, SubnetId=rig.subnet_id,
                TagSpecifications=[{"ResourceType": "instance", "Tags": tag_list},
                                   {"ResourceType": "volume", "Tags": tag_list}])["Instances"][0]
            vols = [m["Ebs"]["VolumeId"] for m in inst.get("BlockDeviceMappings") or [] if m.get("Ebs")]
            return [inst["InstanceId"], *vols]

        def handed(ref: RunRef) -> Handed:
            # The user data moto recorded for the instance (base64, as EC2 answers it).
            [instance] = machines(ref)
            value = ec2.describe_instance_attribute(InstanceId=instance, Attribute="userData")["UserData"].get("Value")
            return Handed(user_data=base64.b64decode(value).decode() if value else None)

        @contextmanager
        def slow_release() -> Iterator[None]:
            # EC2 accepts the termination but reports it still shutting down.
            hold = inject("ec2", "TerminateInstances", response={"TerminatingInstances": [
                {"InstanceId": "i-held", "CurrentState": {"Name": "shutting-down"}}]})
            rig.listeners.append(hold)
            try:
                yield
            finally:
                rig.listeners.remove(hold)

        @contextmanager
        def refuse(kind: str, code: str) -> Iterator[None]:
            proxy.every = (code, STATUS[kind])
            try:
                yield
            finally:
                proxy.every = None

        # The provider reaches moto through a proxy on loopback that can answer EC2's own error bodies.
        proxy = RefusingProxy(rig.url).start()
        ref = RunRef("test", "org-1", "run-c1")
        try:
            yield ProviderEnv(
                provider=dataclasses.replace(rig, url=proxy.url).compute(page_size=PAGE), ref=ref, spec=spec,
                machines=machines, disks=disks,
                everything=everything, add_foreign=add_foreign, page_size=PAGE, handed=handed,
                list_requests=lambda: sum(1 for _, op in rig.log.calls if op == "DescribeInstances"),
                slow_release=slow_release, refuse=refuse)
        finally:
            proxy.stop()
