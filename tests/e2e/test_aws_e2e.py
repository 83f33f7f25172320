"""End to end on AWS through the real function handlers: EC2 is moto in server mode on
loopback, the Pricing API is the recorded-pages fake, a test-side agent plays the VM.

The registry builds the real AwsCompute; the endpoints come from AWS_ENDPOINT_URL /
AWS_ENDPOINT_URL_PRICING, which botocore honours natively, and registry.override only adds
the call counter (on_api_call).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shared.providers import registry
from shared.providers.aws.compute import build
from tests.harness import Harness, trained_adapter_zip
from tests.providers.aws.rig import ZONE, CallLog, Rig

pytestmark = pytest.mark.e2e


@pytest.fixture
def aws(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", rig.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", rig.pricing.url)
    log = CallLog()
    with registry.override("aws", factory=lambda config, settings: build(config, settings, on_api_call=log)):
        yield {"ec2": rig.ec2, "log": log, "body": rig.body(workspace_disk_gb=50)}


@pytest.fixture
def aws_h(env: dict[str, str], aws: dict[str, Any]) -> Iterator[Harness]:
    harness = Harness()
    assert harness.save_storage({"kind": "local"})["status"] == "connected"
    conn = harness.save_compute("aws", dict(aws["body"]))
    assert conn["status"] == "connected", conn["checks"]
    assert "wJalr" not in str(conn)  # secrets are write-only
    yield harness
    harness.close()


def _instance(aws: dict[str, Any], instance_id: str) -> dict[str, Any]:
    found: dict[str, Any] = aws["ec2"].describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return found


def _volumes(aws: dict[str, Any], ids: list[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = aws["ec2"].describe_volumes(Filters=[{"Name": "volume-id", "Values": ids}])["Volumes"]
    return found


def _launch(harness: Harness, aws: dict[str, Any]) -> tuple[str, str, list[str]]:
    offers = harness.ok("GET", "/api/catalog/gpus", params={"provider": "aws"})["items"]
    assert offers and all(o["zone"] == ZONE for o in offers)
    assert not any("T4" in o["gpu"] for o in offers)
    offer = next(o for o in offers if o["machine_type"] == "g6.xlarge")
    assert "NAT" in offer["note"]
    run_id = harness.create_run("aws", offer["offer_id"])
    aws["log"].take()
    run = harness.launch(run_id)
    launch_calls = aws["log"].take()
    assert run["state"] == "provisioning", run["reason"]
    # Warm catalog; the preflight's one quota read (issue 37.3); STS once: the account the run records as its scope.
    assert launch_calls[0] == ("servicequotas", "GetServiceQuota"), launch_calls
    assert len(launch_calls) <= 5, launch_calls
    instance_id = next(r["id"] for r in run["resources"] if r["kind"] == "instance")
    volumes = [r["id"] for r in run["resources"] if r["kind"] == "volume"]
    assert volumes
    tags = {t["Key"]: t["Value"] for t in _instance(aws, instance_id)["Tags"]}
    assert tags["tensorant:run"] == run_id and tags["tensorant:deployment"] == "test"
    assert tags["tensorant:org"] == harness.org and tags["tensorant:managed"] == "true"
    return run_id, instance_id, volumes


def test_trial_succeeds_and_instance_and_volume_are_gone(aws_h: Harness, aws: dict[str, Any]) -> None:
    run_id, instance_id, volumes = _launch(aws_h, aws)
    assert _instance(aws, instance_id)["State"]["Name"] in ("pending", "running")
    aws_h.agent(run_id).train(trained_adapter_zip())
    release_calls = aws["log"].take()
    run = aws_h.get_run(run_id)
    assert run["state"] == "succeeded", (run["reason"], run["release_error"], aws_h.step_errors)
    assert _instance(aws, instance_id)["State"]["Name"] == "terminated"
    assert _volumes(aws, volumes) == []
    assert [op for _, op in release_calls].count("TerminateInstances") == 1
    print(f"\nrelease phase AWS calls: {[op for _, op in release_calls]}")


def test_timed_out_trial_is_stopped_with_its_disk_then_recovered(aws_h: Harness, aws: dict[str, Any]) -> None:
    run_id, instance_id, volumes = _launch(aws_h, aws)
    agent = aws_h.agent(run_id)
    agent.heartbeat("training", 0.4)
    run = aws_h.expire(run_id)
    assert run["state"] == "retained", (run["reason"], aws_h.step_errors)
    assert _instance(aws, instance_id)["State"]["Name"] == "stopped"
    assert [v["State"] for v in _volumes(aws, volumes)] == ["in-use"]  # the disk is kept
    assert "compute billing stopped" in run["billing_note"] and "still bills" in run["billing_note"]

    # Recovery: start the machine on request (billing resumes, training does not) ...
    started = aws_h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    assert _instance(aws, instance_id)["State"]["Name"] in ("pending", "running")
    assert started["state"] == "retained" and "billing resumes" in started["billing_note"]
    # ... then hand in the adapter fetched from it, which is verified, and the machine released.
    run = aws_h.recover(run_id, upload=trained_adapter_zip())
    assert run["state"] == "succeeded", (run["reason"], run["release_error"], aws_h.step_errors)
    assert _instance(aws, instance_id)["State"]["Name"] == "terminated"
    assert _volumes(aws, volumes) == []


def test_launch_sends_the_real_image_and_the_runs_training_settings(aws_h: Harness, aws: dict[str, Any]) -> None:
    from shared.settings import get_settings
    from tests.e2e.wire import TRAINING, assert_training_sent, from_user_data

    aws_h.ok("PUT", "/api/org/secrets/huggingface-token", json_body={"token": "hf_awsWireToken0123456789"})
    offers = aws_h.ok("GET", "/api/catalog/gpus", params={"provider": "aws"})["items"]
    offer = next(o for o in offers if o["machine_type"] == "g6.xlarge")
    run_id = aws_h.create_run("aws", offer["offer_id"], training=TRAINING)
    run = aws_h.launch(run_id)
    instance_id = next(r["id"] for r in run["resources"] if r["kind"] == "instance")
    user_data = aws["ec2"].describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    import base64

    assert b"hf_awsWireToken" not in base64.b64decode(user_data["UserData"]["Value"])  # readable through IMDS
    image, env = from_user_data(user_data["UserData"]["Value"], aws_h)
    assert image == get_settings().container_image
    assert_training_sent(env, run)
    assert env["TENSORANT_BASE_MODEL"] == run["base_model"] and env["HF_TOKEN"] == "hf_awsWireToken0123456789"
