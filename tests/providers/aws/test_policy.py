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
    for placeholder in ("REGION", "ACCOUNT_ID", "AMI_ID", "SUBNET_ID", "SECURITY_GROUP_ID", "KEY_NAME", "DEPLOYMENT_ID"):
        assert placeholder in text
    policy = json.loads(text)
    sids = {s["Sid"] for s in policy["Statement"]}
    assert {"DiscoverAndPrice", "ApprovedLaunchInputs", "CreateTaggedSingleGpuInstances", "CreateTaggedDisks",
            "TagsAtLaunchOnly",
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


def _statements() -> dict[str, Any]:
    return {s["Sid"]: s for s in json.loads((INFRA / "control-plane-policy.json").read_text())["Statement"]}


def test_every_tag_condition_names_this_deployment() -> None:
    """Issue 41.6: stop/terminate covered any instance tagged tensorant:managed=true, a tag every deployment
    shares: one deployment's credentials could stop another's runs in the same account."""
    tagged = 0
    for sid, st in _statements().items():
        cond = st.get("Condition", {}).get("StringEquals", {})
        for kind in ("aws:RequestTag", "ec2:ResourceTag"):
            if f"{kind}/tensorant:managed" in cond:
                tagged += 1
                assert cond.get(f"{kind}/tensorant:deployment") == "DEPLOYMENT_ID", sid
    assert tagged >= 5


def test_run_instances_creates_only_single_gpu_types(rig: Rig) -> None:
    """Issue 41.6: RunInstances had no instance-type condition (IAM has no count key: MinCount = MaxCount = 1 is
    the adapter's, tests/providers/aws/test_lifecycle.py). The list holds every type the catalog offers and no
    multi-GPU type."""
    instance = _statements()["CreateTaggedSingleGpuInstances"]
    assert instance["Resource"].endswith(":instance/*")
    allowed = set(instance["Condition"]["StringEquals"]["ec2:InstanceType"])
    offered = {o.machine_type for o in rig.compute().offers()}
    assert offered and offered <= allowed, offered - allowed
    multi = {t["InstanceType"] for page in rig.ec2.get_paginator("describe_instance_types").paginate()
             for t in page["InstanceTypes"] if sum(g.get("Count", 0) for g in (t.get("GpuInfo") or {}).get("Gpus", [])) > 1}
    assert multi and not (multi & allowed), multi & allowed


def test_launches_carry_the_deployment_tag_the_policy_requires(rig: Rig) -> None:
    compute = rig.compute()
    compute.launch(_spec())
    tags = {t["Key"]: t["Value"] for r in rig.ec2.describe_instances()["Reservations"] for i in r["Instances"]
            for t in i.get("Tags", [])}
    assert tags["tensorant:managed"] == "true" and tags["tensorant:deployment"] == "test"
