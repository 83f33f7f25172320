"""AWS: the training container cannot reach the instance profile's credentials.

RunInstances asks for IMDSv2 only (HttpTokens=required) with a PUT response hop limit of 1,
so the token answer cannot cross the docker bridge into the container. Checked on the wire
(the request the adapter sends) and as moto stores the instance.
"""

from __future__ import annotations

from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from tests.providers.aws.rig import Rig
from tests.providers.aws.test_lifecycle import OFFER

BOOT = Bootstrap(container_image="ghcr.io/tensorant/trainer:2026.11",
                 env={"TENSORANT_RUN_ID": "run-imds", "TENSORANT_RUN_TOKEN": "tok",
                      "TENSORANT_API_URL": "https://cp.example.com"},
                 secret_env_keys=frozenset())


def test_run_instances_sets_imds_hop_limit_one(rig: Rig) -> None:
    compute = rig.compute()
    resources = compute.launch(LaunchSpec(ref=RunRef("test", "org-1", "run-imds"), offer=OFFER, bootstrap=BOOT))
    # The request on the wire (EC2's query protocol): botocore's serialized body.
    [sent] = [p for (_, op), p in zip(rig.log.calls, rig.log.params, strict=True) if op == "RunInstances"]
    body = sent["body"]  # the query parameters botocore encodes into the POST body
    assert body["MetadataOptions.HttpTokens"] == "required"
    assert str(body["MetadataOptions.HttpPutResponseHopLimit"]) == "1"
    [instance_id] = [r.id for r in resources if r.kind == "instance"]
    inst = rig.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    assert inst["MetadataOptions"]["HttpTokens"] == "required"
    assert inst["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
