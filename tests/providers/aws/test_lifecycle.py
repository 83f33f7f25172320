"""launch / describe / retain / start / release / list_managed against moto, with call counts.

Errors moto cannot produce (capacity, quota, throttling) are injected through botocore's
before-call event on the adapter's real client (tests.providers.aws.rig.inject).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from shared.errors import AuthError, CapacityError, PermanentError, ProviderError, QuotaError, ThrottledError
from shared.models import CloudResource, GpuOffer, MachineState
from shared.providers.aws.client import THROTTLE_ATTEMPTS
from shared.providers.aws.compute import block_device_mappings, client_token
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from tests.providers.aws.rig import AMI_GOOD, ZONE, Rig, add_injection, inject, strict_client_token

OFFER = GpuOffer(provider="aws", offer_id=f"us-east-1/{ZONE}/g6.xlarge", gpu="NVIDIA L4", gpu_memory_gb=22.4,
                 machine_type="g6.xlarge", region="us-east-1", zone=ZONE, compute_per_hour=0.8048,
                 disk_per_hour=0.0126, total_per_hour=0.8174)
BOOT = Bootstrap(container_image="ghcr.io/tensorant/trainer:2026.11",
                 env={"TENSORANT_RUN_ID": "run-0001", "TENSORANT_RUN_TOKEN": "tok-secret-123456",
                      "TENSORANT_API_URL": "https://cp.example.com"},
                 secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"}))


def _spec(run: str = "run-0001", deployment: str = "test", disk_gb: int = 0) -> LaunchSpec:
    return LaunchSpec(ref=RunRef(deployment, "org-1", run), offer=OFFER, bootstrap=BOOT, disk_gb=disk_gb)


def _ops(rig: Rig) -> list[str]:
    return [op for _, op in rig.log.take()]


def _instance(rig: Rig, instance_id: str) -> dict[str, Any]:
    return rig.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]


def _volume_ids(resources: list[CloudResource]) -> list[str]:
    return [r.id for r in resources if r.kind == "volume"]


def _volumes_left(rig: Rig, volume_ids: list[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = rig.ec2.describe_volumes(
        Filters=[{"Name": "volume-id", "Values": volume_ids}])["Volumes"]
    return found


def test_launch_request_and_resources(rig: Rig) -> None:
    compute = rig.compute()
    spec = _spec()
    resources = compute.launch(spec)
    assert _ops(rig) == ["DescribeInstances", "DescribeImages", "RunInstances"]  # warm catalog: 3 calls
    [instance_res] = [r for r in resources if r.kind == "instance"]
    [volume_id] = _volume_ids(resources)
    assert instance_res.created_at is not None and instance_res.run_id == "run-0001" and instance_res.org == "org-1"
    inst = _instance(rig, instance_res.id)
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags.items() >= spec.ref.tags.items()
    assert inst["ImageId"] == AMI_GOOD and inst["InstanceType"] == "g6.xlarge"
    assert inst["MetadataOptions"]["HttpTokens"] == "required"
    assert "PublicIpAddress" not in inst
    [nic] = inst["NetworkInterfaces"]
    assert nic["SubnetId"] == rig.subnet_id and [g["GroupId"] for g in nic["Groups"]] == [rig.sg_id]
    [vol] = rig.ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"]
    assert (vol["Size"], vol["VolumeType"], vol["Encrypted"]) == (15 + 100, "gp3", True)
    [mapping] = inst["BlockDeviceMappings"]
    assert mapping["Ebs"]["VolumeId"] == volume_id and mapping["Ebs"]["DeleteOnTermination"] is True
    assert {t["Key"]: t["Value"] for t in vol["Tags"]}.items() >= spec.ref.tags.items()
    user_data = rig.ec2.describe_instance_attribute(InstanceId=instance_res.id, Attribute="userData")
    text = base64.b64decode(user_data["UserData"]["Value"]).decode()
    assert text.startswith("#cloud-config") and "ghcr.io/tensorant/trainer:2026.11" in text


def test_launch_parameters_on_the_wire(rig: Rig) -> None:
    rig.ec2.create_key_pair(KeyName="ops")
    compute = rig.compute(key_name="ops")
    spec = _spec(disk_gb=40)
    compute.launch(spec)
    body = next(p["body"] for p in rig.log.params if p["body"].get("Action") == "RunInstances")
    assert len(body["ClientToken"]) <= 64
    assert (body["MinCount"], body["MaxCount"], body["KeyName"]) == (1, 1, "ops")
    assert body["NetworkInterface.1.AssociatePublicIpAddress"] == "false"
    assert body["NetworkInterface.1.DeviceIndex"] == 0
    assert body["MetadataOptions.HttpTokens"] == "required"
    assert body["BlockDeviceMapping.1.Ebs.VolumeSize"] == 15 + 40
    assert body["BlockDeviceMapping.1.Ebs.Encrypted"] == "true"
    assert body["BlockDeviceMapping.1.Ebs.DeleteOnTermination"] == "true"
    assert "SpotPrice" not in str(body) and "InstanceMarketOptions" not in str(body)
    resource_types = {v for k, v in body.items() if k.startswith("TagSpecification") and k.endswith("ResourceType")}
    assert resource_types == {"instance", "volume"}
    managed = [k for k, v in body.items() if k.endswith(".Key") and v == "tensorant:managed"]
    assert len(managed) == 2  # the policy's aws:RequestTag/tensorant:managed condition, on both
    params = {"ImageId": AMI_GOOD, "UserData": "a"}
    assert client_token(spec.ref, params) == client_token(_spec().ref, dict(params))  # deterministic
    assert client_token(spec.ref, params) != client_token(_spec(run="run-0002").ref, params)
    assert client_token(spec.ref, params) != client_token(spec.ref, {**params, "UserData": "b"})


def test_user_data_that_cannot_render_fails_before_run_instances(rig: Rig) -> None:
    # The environment is not in the user data (a claim is: cloudinit.py); the image name is, as it is.
    bad = Bootstrap(container_image="ghcr.io/tensorant/trainer:1\nruncmd: [x]", env=dict(BOOT.env))
    spec = LaunchSpec(ref=RunRef("test", "org-1", "run-0001"), offer=OFFER, bootstrap=bad)
    with pytest.raises(PermanentError) as info:
        rig.compute().launch(spec)
    assert "one line" in info.value.reason
    assert "RunInstances" not in _ops(rig)
    assert rig.ec2.describe_instances()["Reservations"] == []


def test_secondary_ami_disks_are_suppressed() -> None:
    from shared.providers.aws.catalog import root_size_gb

    image = {"RootDeviceName": "/dev/xvda", "BlockDeviceMappings": [
        {"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 60}},
        {"DeviceName": "/dev/sdb", "Ebs": {"VolumeSize": 500}}, {"DeviceName": "/dev/sdc", "VirtualName": "ephemeral0"}]}
    assert root_size_gb(image) == 60
    assert block_device_mappings(image, 100) == [
        {"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 160, "VolumeType": "gp3", "Encrypted": True,
                                            "DeleteOnTermination": True}},
        {"DeviceName": "/dev/sdb", "NoDevice": ""}, {"DeviceName": "/dev/sdc", "NoDevice": ""}]


def test_launch_twice_finds_the_instance_by_tags(rig: Rig) -> None:
    compute = rig.compute()
    first = compute.launch(_spec())
    rig.log.take()
    # A fresh adapter (as after a crash between create and record) finds it by tags.
    again = rig.compute().launch(_spec())
    assert _ops(rig) == ["DescribeInstances"]
    assert [r.id for r in again] == [r.id for r in first]
    instances = [i for r in rig.ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    assert len(instances) == 1


def test_a_retry_that_misses_the_new_instance_is_no_parameter_mismatch(rig: Rig, injected: list[Any]) -> None:
    # EC2 keeps a ClientToken with its parameters (moto does not): a retry whose tag lookup misses a
    # brand-new instance must send identical parameters, or a token of its own, never the old token
    # with a new request (IdempotentParameterMismatch failed such a retry).
    add_injection(injected, strict_client_token(rig.ec2))
    compute = rig.compute()
    [first] = [r.id for r in compute.launch(_spec()) if r.kind == "instance"]
    add_injection(injected, inject("ec2", "DescribeInstances", response={"Reservations": []}, times=1))
    same = [r.id for r in compute.launch(_spec()) if r.kind == "instance"]
    assert same == [first]  # the same request: EC2 answers with the instance it made
    # A new run token (every attempt mints one) changes nothing in the request: the user data holds a claim.
    fresh = Bootstrap(container_image=BOOT.container_image, env={**BOOT.env, "TENSORANT_RUN_TOKEN": "tok-2"})
    add_injection(injected, inject("ec2", "DescribeInstances", response={"Reservations": []}, times=1))
    assert [r.id for r in compute.launch(LaunchSpec(ref=_spec().ref, offer=OFFER, bootstrap=fresh))
            if r.kind == "instance"] == [first]
    # Another image (the operator changed it between attempts) is another request, not a mismatch.
    other = Bootstrap(container_image="ghcr.io/tensorant/trainer:2026.12", env=dict(BOOT.env))
    add_injection(injected, inject("ec2", "DescribeInstances", response={"Reservations": []}, times=1))
    compute.launch(LaunchSpec(ref=_spec().ref, offer=OFFER, bootstrap=other))  # no mismatch raised
    bodies = [p["body"] for p in rig.log.params if p["body"].get("Action") == "RunInstances"]
    assert len({b["ClientToken"] for b in bodies}) == 2, bodies


@pytest.mark.parametrize("code,message,error,phrases", [
    ("InsufficientInstanceCapacity",
     "We currently do not have sufficient g6.xlarge capacity in the Availability Zone you requested (us-east-1a). "
     "Our system will be working on provisioning additional capacity. You can currently get g6.xlarge capacity "
     "by not specifying an Availability Zone in your request or choosing us-east-1b, us-east-1c.",
     CapacityError, ["us-east-1b, us-east-1c", "another GPU type", "later"]),
    ("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit of 0 allows",
     QuotaError, ["Service Quotas", "Running On-Demand G and VT instances"]),
    ("Unsupported", "The requested configuration is currently not supported.", PermanentError, ["another GPU type"]),
    ("InvalidParameterCombination", "The instance type g6.xlarge is not supported in us-east-1a", PermanentError,
     ["not supported"]),
    ("UnauthorizedOperation", "You are not authorized to perform this operation.", AuthError, ["IAM policy"]),
])
def test_launch_errors_are_translated_fail_fast_and_leave_nothing(
        rig: Rig, injected: list[Any], code: str, message: str, error: type[ProviderError],
        phrases: list[str]) -> None:
    add_injection(injected, inject("ec2", "RunInstances", code, message))
    with pytest.raises(error) as info:
        rig.compute().launch(_spec())
    assert type(info.value) is error
    for phrase in phrases:
        assert phrase in info.value.reason
    assert _ops(rig).count("RunInstances") == 1  # never retried
    assert rig.ec2.describe_instances()["Reservations"] == []


def test_quota_names_the_p_family_quota(rig: Rig, injected: list[Any]) -> None:
    from shared.providers.aws.errors import translate

    class Err(Exception):
        response = {"Error": {"Code": "VcpuLimitExceeded", "Message": "limit 0"}}

    assert "Running On-Demand P instances" in translate(Err(), action="x", instance_type="p5.4xlarge").reason


def test_throttling_is_retried_with_backoff_then_gives_up(rig: Rig, injected: list[Any]) -> None:
    sleeps: list[float] = []
    compute = rig.compute(sleep=sleeps.append)
    add_injection(injected, inject("ec2", "RunInstances", "RequestLimitExceeded", "Request limit exceeded.", times=2))
    compute.launch(_spec())
    assert _ops(rig).count("RunInstances") == 3
    assert len(sleeps) == 2 and all(0 <= s <= 8 for s in sleeps)
    add_injection(injected, inject("ec2", "DescribeInstances", "Throttling", "Rate exceeded"))
    with pytest.raises(ThrottledError):
        compute.describe(_spec().ref, [])
    assert _ops(rig).count("DescribeInstances") == THROTTLE_ATTEMPTS


def test_retain_start_release_with_call_counts(rig: Rig) -> None:
    compute = rig.compute()
    ref = _spec().ref
    resources = compute.launch(_spec())
    volumes = _volume_ids(resources)
    rig.log.take()
    counts: dict[str, list[int]] = {}

    def step(name: str, fn: Any) -> Any:
        outcome = fn(ref, resources)
        counts.setdefault(name, []).append(len(rig.log.take()))
        return outcome

    out = step("retain", compute.retain)
    while not out.done:
        out = step("retain", compute.retain)
    assert _instance(rig, resources[0].id)["State"]["Name"] == "stopped"
    assert "compute billing stopped" in out.billing_note and "still bills" in out.billing_note
    assert [v["State"] for v in _volumes_left(rig, volumes)] == ["in-use"]  # disk kept
    assert compute.describe(ref, resources).state == MachineState.stopped
    rig.log.take()

    out = step("start", compute.start)
    while not out.done:
        out = step("start", compute.start)
    assert "billing resumes" in out.billing_note and "Training does not resume" in out.billing_note
    assert _instance(rig, resources[0].id)["State"]["Name"] == "running"

    out = step("release", compute.release)
    while not out.done:
        out = step("release", compute.release)
    assert _instance(rig, resources[0].id)["State"]["Name"] == "terminated"
    assert _volumes_left(rig, volumes) == []
    assert compute.describe(ref, resources).state == MachineState.gone
    # Released again (retry after a crash): "not found"/terminated means done, without a terminate call.
    rig.log.take()
    assert compute.release(ref, resources).done
    assert "TerminateInstances" not in _ops(rig)
    print(f"\nAWS calls per invocation: {counts}")
    assert max(counts["release"]) <= 3 and max(counts["retain"]) <= 3 and max(counts["start"]) <= 3


def test_release_without_volume_permission_infers_from_delete_on_termination(
        rig: Rig, injected: list[Any]) -> None:
    compute = rig.compute()
    ref = _spec().ref
    resources = compute.launch(_spec())
    add_injection(injected, inject("ec2", "DescribeVolumes", "UnauthorizedOperation", "not authorized"))
    out = compute.release(ref, resources)
    while not out.done:
        out = compute.release(ref, resources)
    assert "DeleteOnTermination" in out.detail


def test_release_waits_for_a_lingering_volume(rig: Rig) -> None:
    compute = rig.compute()
    ref = _spec().ref
    resources = compute.launch(_spec())
    leftover = rig.ec2.create_volume(AvailabilityZone=ZONE, Size=10, TagSpecifications=[
        {"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in ref.tags.items()]}])["VolumeId"]
    compute.release(ref, resources)
    out = compute.release(ref, resources)
    assert not out.done and leftover in out.detail


def test_foreign_instances_are_never_stopped_or_terminated(rig: Rig) -> None:
    compute = rig.compute()
    foreign = rig.ec2.run_instances(ImageId=AMI_GOOD, MinCount=1, MaxCount=1, InstanceType="g6.xlarge",
                                    TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                        {"Key": "tensorant:managed", "Value": "true"},
                                        {"Key": "tensorant:deployment", "Value": "other"},
                                        {"Key": "tensorant:run", "Value": "run-0001"}]}])["Instances"][0]["InstanceId"]
    ref = _spec().ref
    fake = [CloudResource(provider="aws", kind="instance", id=foreign)]
    for method in (compute.release, compute.retain, compute.start):
        with pytest.raises(PermanentError) as info:
            method(ref, fake)
        assert "never touches" in info.value.reason
    ops = _ops(rig)
    assert "TerminateInstances" not in ops and "StopInstances" not in ops
    inst = _instance(rig, foreign)
    assert inst["State"]["Name"] == "running" and len(inst["Tags"]) == 3  # tags untouched


def test_release_of_a_missing_instance_is_done(rig: Rig) -> None:
    gone = [CloudResource(provider="aws", kind="instance", id="i-0fffffffffffffff0")]
    assert rig.compute().release(_spec().ref, gone).done
    assert rig.compute().describe(_spec().ref, gone).state == MachineState.gone


def test_list_managed_paginates_and_sees_only_this_deployment(rig: Rig) -> None:
    compute = rig.compute()
    for n in range(7):
        compute.launch(_spec(run=f"run-{n:04d}"))
    rig.compute(deployment="other").launch(_spec(run="run-9999", deployment="other"))
    rig.ec2.run_instances(ImageId=AMI_GOOD, MinCount=1, MaxCount=1, InstanceType="g6.xlarge")  # untagged
    rig.log.take()
    compute.page_size = 5
    found = list(compute.list_managed())
    ops = _ops(rig)
    assert ops.count("DescribeInstances") == 2  # 7 instances at 5 a page
    instances = [r for r in found if r.kind == "instance"]
    volumes = [r for r in found if r.kind == "volume"]
    assert sorted(r.run_id for r in instances) == [f"run-{n:04d}" for n in range(7)]
    assert len(volumes) == 7 and all(r.deployment == "test" and r.org == "org-1" for r in found)
    assert all(r.created_at is not None for r in found)
