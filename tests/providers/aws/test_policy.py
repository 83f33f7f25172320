"""The IAM policy template in infra/aws grants every AWS action the adapter calls."""

from __future__ import annotations

import json
from typing import Any

from shared.models import CloudResource
from shared.providers.base import RunRef
from tests.providers.aws.policy import INFRA, granted_actions, not_granted
from tests.providers.aws.rig import ACCOUNT, Rig
from tests.providers.aws.test_lifecycle import _spec


def test_template_has_the_placeholders_and_passrole() -> None:
    text = (INFRA / "control-plane-policy.json").read_text()
    for placeholder in ("REGION", "ACCOUNT_ID", "AMI_ID", "SUBNET_ID", "SECURITY_GROUP_ID", "KEY_NAME"):
        assert placeholder in text
    policy = json.loads(text)
    sids = {s["Sid"] for s in policy["Statement"]}
    assert {"DiscoverAndPrice", "ApprovedLaunchInputs", "CreateTaggedComputeAndDisks", "TagsAtLaunchOnly",
            "ManageTaggedTrainingInstances"} <= sids
    passrole = json.loads((INFRA / "passrole-statement.json").read_text())
    assert passrole["Action"] == "iam:PassRole"
    assert passrole["Condition"]["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com"


def test_checker_can_fail() -> None:
    assert not_granted({"ec2:DeleteVolume", "ec2:CreateTags", "ec2:DescribeImages"}) == ["ec2:DeleteVolume"]
    assert "pricing:GetProducts" in granted_actions()


def test_every_action_of_a_full_lifecycle_is_granted(rig: Rig) -> None:
    rig.ec2.create_key_pair(KeyName="ops")
    rig.iam.create_role(RoleName="ssm", AssumeRolePolicyDocument="{}")
    rig.iam.create_instance_profile(InstanceProfileName="ssm-profile")
    rig.iam.add_role_to_instance_profile(InstanceProfileName="ssm-profile", RoleName="ssm")
    compute = rig.compute(key_name="ops", instance_profile_arn=f"arn:aws:iam::{ACCOUNT}:instance-profile/ssm-profile")
    compute.validate()
    compute.offers()
    ref: RunRef = _spec().ref
    resources: list[CloudResource] = compute.launch(_spec())
    compute.describe(ref, resources)
    for method in (compute.retain, compute.start, compute.release):
        outcome: Any = method(ref, resources)
        while not outcome.done:
            outcome = method(ref, resources)
    list(compute.list_managed())
    actions = {f"{service}:{op}" for service, op in rig.log.calls}
    assert {"ec2:RunInstances", "ec2:StopInstances", "ec2:StartInstances", "ec2:TerminateInstances",
            "pricing:GetProducts", "sts:GetCallerIdentity", "iam:GetInstanceProfile"} <= actions
    assert "ec2:CreateTags" not in actions  # tags only at launch
    assert not_granted(actions) == []
