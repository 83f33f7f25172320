"""What EC2 does to an instance that powers itself off: the launch sets InstanceInitiatedShutdownBehavior=stop,
so the agent's guest poweroff (past its deadline, the control plane gone) stops the instance: compute billing
ends and its EBS disk, with the checkpoint, is kept (`terminate` would delete the disk). Read back from moto."""

from __future__ import annotations

from tests.providers.aws.rig import Rig
from tests.providers.aws.test_lifecycle import _spec


def test_a_guest_poweroff_stops_the_instance_and_keeps_its_disk(rig: Rig) -> None:
    resources = rig.compute().launch(_spec())
    [instance_id] = [r.id for r in resources if r.kind == "instance"]
    got = rig.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior")
    assert got["InstanceInitiatedShutdownBehavior"]["Value"] == "stop"
    body = next(p["body"] for p in rig.log.params if p["body"].get("Action") == "RunInstances")
    assert body["InstanceInitiatedShutdownBehavior"] == "stop"
