"""validate(): every check against moto (real wire protocol), each with a fix hint."""

from __future__ import annotations

from typing import Any

import pytest

from shared.models import CheckStatus
from tests.providers.aws.rig import (
    ACCOUNT,
    AMI_ARM,
    AMI_INSTANCE_STORE,
    AMI_MARKETPLACE,
    AMI_PENDING,
    AMI_WINDOWS,
    Rig,
    add_injection,
    inject,
)


def _by_name(checks: list[Any]) -> dict[str, Any]:
    return {c.name: c for c in checks}


def test_good_connection_passes_every_check_and_launches_nothing(rig: Rig) -> None:
    rig.ec2.create_key_pair(KeyName="ops")
    rig.iam.create_role(RoleName="ssm", AssumeRolePolicyDocument="{}")
    rig.iam.create_instance_profile(InstanceProfileName="ssm-profile")
    rig.iam.add_role_to_instance_profile(InstanceProfileName="ssm-profile", RoleName="ssm")
    compute = rig.compute(key_name="ops", instance_profile_arn=f"arn:aws:iam::{ACCOUNT}:instance-profile/ssm-profile")
    checks = _by_name(compute.validate())
    failing = {n: c.message for n, c in checks.items() if c.status != CheckStatus.ok}
    assert failing.keys() == {"not_proven"}, failing
    assert set(checks) >= {"credentials", "ebs_key", "image", "image_available", "image_architecture", "image_root_device",
                           "image_platform", "image_marketplace", "subnet", "security_group", "zone_gpus",
                           "key_pair", "instance_profile", "catalog", "not_proven"}
    for phrase in ("image boots", "Docker", "quota", "outbound network"):
        assert phrase in checks["not_proven"].message
    assert "PassRole" in checks["instance_profile"].message
    assert "g6.xlarge" in checks["catalog"].message
    # Saving launches nothing and never asks to create anything.
    assert not [op for _, op in rig.log.calls if op.startswith(("Run", "Create", "Start"))]
    assert rig.ec2.describe_instances()["Reservations"] == []


@pytest.mark.parametrize("ami,check,phrase", [
    (AMI_MARKETPLACE, "image_marketplace", "Marketplace product code"),
    (AMI_ARM, "image_architecture", "arm64"),
    (AMI_INSTANCE_STORE, "image_root_device", "instance-store"),
    (AMI_WINDOWS, "image_platform", "Linux/UNIX"),
    (AMI_PENDING, "image_available", "pending, not available"),
    ("ami-0fffffffffffffff0", "image", "not found"),
])
def test_each_bad_image_fails_its_own_check(rig: Rig, ami: str, check: str, phrase: str) -> None:
    checks = _by_name(rig.compute(ami_id=ami).validate())
    failed = [n for n, c in checks.items() if c.status == CheckStatus.fail]
    assert check in failed and phrase in checks[check].message
    # Only that image check fails; the catalog cannot load without a good image.
    assert set(failed) == {check, "catalog"}


def test_missing_subnet_and_group_from_another_vpc(rig: Rig) -> None:
    other_vpc = rig.ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
    sg = rig.ec2.create_security_group(GroupName="elsewhere", Description="x", VpcId=other_vpc)["GroupId"]
    checks = _by_name(rig.compute(security_group_id=sg).validate())
    assert checks["security_group"].status == CheckStatus.fail
    assert "subnet's VPC" in checks["security_group"].message
    checks = _by_name(rig.compute(subnet_id="subnet-0fffffffffffffff0",
                                  security_group_id="sg-0fffffffffffffff0").validate())
    assert checks["subnet"].status == CheckStatus.fail and "subnet-" in checks["subnet"].message
    assert checks["security_group"].status == CheckStatus.fail and "not found" in checks["security_group"].message
    assert checks["catalog"].status == CheckStatus.fail


def test_missing_key_pair_and_instance_profile(rig: Rig) -> None:
    rig.iam.create_role(RoleName="ssm", AssumeRolePolicyDocument="{}")
    checks = _by_name(rig.compute(key_name="nope",
                                  instance_profile_arn=f"arn:aws:iam::{ACCOUNT}:instance-profile/nope").validate())
    assert checks["key_pair"].status == CheckStatus.fail and "'nope'" in checks["key_pair"].message
    assert checks["instance_profile"].status == CheckStatus.fail
    assert "Instance profile ARN" in checks["instance_profile"].message
    checks = _by_name(rig.compute(instance_profile_arn="arn:aws:iam::999999999999:instance-profile/x").validate())
    assert "account 999999999999" in checks["instance_profile"].message


def test_zone_without_supported_gpus(rig: Rig, moto_ec2_url: str) -> None:
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=moto_ec2_url, region_name="af-south-1", aws_access_key_id="AKIAX" * 4,
                       aws_secret_access_key="x" * 40)
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.40.1.0/24", AvailabilityZone="af-south-1a")["Subnet"]
    sg = ec2.create_security_group(GroupName="g", Description="g", VpcId=vpc)["GroupId"]
    checks = _by_name(rig.compute(region="af-south-1", subnet_id=subnet["SubnetId"], security_group_id=sg).validate())
    assert checks["zone_gpus"].status == CheckStatus.fail
    assert "af-south-1a offers none" in checks["zone_gpus"].message


def test_root_account_keys_rejected(rig: Rig, injected: list[Any]) -> None:
    add_injection(injected, inject("sts", "GetCallerIdentity", response={
        "UserId": ACCOUNT, "Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:root"}))
    checks = _by_name(rig.compute().validate())
    assert checks["credentials"].status == CheckStatus.fail
    assert "root-account" in checks["credentials"].message
    assert set(checks) == {"credentials", "not_proven"}  # nothing else is asked with root keys


def test_expired_or_bad_credentials(rig: Rig, injected: list[Any]) -> None:
    add_injection(injected, inject("sts", "GetCallerIdentity", "ExpiredToken", "The security token included in "
                                   "the request is expired", status=400))
    checks = _by_name(rig.compute().validate())
    assert checks["credentials"].status == CheckStatus.fail
    assert "expired" in checks["credentials"].message


def test_session_token_warning_is_a_check(rig: Rig) -> None:
    checks = _by_name(rig.compute(access_key_id="ASIAIOSFODNN7EXAMPLE", session_token="FQoGZXIvYXdz-token").validate())
    assert checks["session_token"].status == CheckStatus.warn
    assert "not renew" in checks["session_token"].message


def test_catalog_failure_is_a_failed_check(rig: Rig) -> None:
    rig.pricing.fail_with = (400, "AccessDeniedException")
    checks = _by_name(rig.compute().validate())
    assert checks["catalog"].status == CheckStatus.fail
    assert "us-east-1" in checks["catalog"].message


def test_expired_session_credentials_fail(rig: Rig) -> None:
    from datetime import UTC, datetime

    checks = _by_name(rig.compute(access_key_id="ASIAIOSFODNN7EXAMPLE", session_token="FQoGZXIvYXdz-token",
                                  session_expires_at=datetime(2020, 1, 1, tzinfo=UTC)).validate())
    assert checks["session_token"].status == CheckStatus.fail and "expired" in checks["session_token"].message
    assert "image" not in checks


def test_a_customer_managed_default_ebs_key_is_said_with_its_grants(rig: Rig) -> None:
    # EC2 encrypts the root disk with it; without the grants every instance goes pending -> terminated.
    rig.ebs_default_key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    check = _by_name(rig.compute().validate())["ebs_key"]
    assert check.status == CheckStatus.warn and rig.ebs_default_key in check.message
    for grant in ("kms:CreateGrant", "kms:Decrypt", "kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncrypt*",
                  "kms:DescribeKey", "Client.InternalError"):
        assert grant in check.message, check.message
