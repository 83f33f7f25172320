"""Two AWS connections in two regions of one account, end to end through the real function handlers:
`aws` (us-east-1, the default) and `aws/us-west-2` beside it, on moto in server mode (one server
serves every region) with the recorded Pricing pages. Each is checked and priced on its own, a run
created on `aws/us-west-2` launches there and trains to succeeded, and a sweep of one connection
never touches the other's machine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shared.context import invocation
from shared.models import RunState
from shared.providers import registry
from shared.providers.aws.compute import build
from shared.services.steps import sweep_account
from shared.settings import get_settings
from shared.store import get_store
from tests.harness import SMOKE_MODEL, Harness, trained_adapter_zip
from tests.providers.aws.refusing_proxy import Refusal, RefusingProxy
from tests.providers.aws.rig import ZONE, CallLog, Rig

pytestmark = pytest.mark.e2e

WEST, WEST_ZONE = "us-west-2", "us-west-2a"
NAMED = "/api/connections/compute/aws/named/us-west-2"


def _client(rig: Rig, service: str, region: str) -> Any:
    import boto3

    return boto3.client(service, endpoint_url=rig.url, region_name=region, aws_access_key_id="AKIAIOSFODNN7EXAMPLE",
                        aws_secret_access_key="x" * 40)


@pytest.fixture
def west(rig: Rig) -> dict[str, Any]:
    """A VPC, subnet and security group in us-west-2 (moto keeps each region apart), and its EC2 client."""
    ec2 = _client(rig, "ec2", WEST)
    vpc = ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.30.1.0/24", AvailabilityZone=WEST_ZONE)["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName="tensorant-train", Description="training", VpcId=vpc)["GroupId"]
    return {"ec2": ec2, "body": rig.body(region=WEST, subnet_id=subnet, security_group_id=sg, workspace_disk_gb=50)}


@pytest.fixture
def two(env: dict[str, str], rig: Rig, west: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", rig.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", rig.pricing.url)
    log = CallLog()
    with registry.override("aws", factory=lambda config, settings: build(config, settings, on_api_call=log)):
        h = Harness()
        assert h.save_storage({"kind": "local"})["status"] == "connected"
        east = h.save_compute("aws", rig.body(workspace_disk_gb=50))
        assert east["status"] == "connected", east["checks"]
        h.ok("PUT", NAMED, json_body=west["body"])
        h.drain()
        yield h
        h.close()


def _instances(ec2: Any) -> list[dict[str, Any]]:
    return [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"]


def test_each_region_is_checked_and_priced_on_its_own(two: Harness) -> None:
    conn = two.ok("GET", NAMED)
    assert conn["status"] == "connected", conn["checks"]
    assert conn["name"] == "aws/us-west-2" and conn["config"]["region"] == WEST
    assert "wJalr" not in str(conn)  # secrets are write-only
    assert two.ok("GET", "/api/connections/compute/aws")["config"]["region"] == "us-east-1"
    west = two.ok("GET", "/api/catalog/gpus", params={"connection": "aws/us-west-2"})["items"]
    east = two.ok("GET", "/api/catalog/gpus", params={"connection": "aws"})["items"]
    assert west and all(o["region"] == WEST and o["zone"] == WEST_ZONE and o["connection"] == "aws/us-west-2"
                        for o in west)
    assert east and all(o["region"] == "us-east-1" and o["zone"] == ZONE and o["connection"] == "aws" for o in east)
    # The recorded price list has g5.xlarge in both regions at their own prices (us-west-2's from its own page).
    assert {o["offer_id"] for o in west}.isdisjoint({o["offer_id"] for o in east})
    both = two.ok("GET", "/api/catalog/gpus", params={"provider": "aws"})
    assert {c["connection"] for c in both["catalogs"]} == {"aws", "aws/us-west-2"}
    assert len(both["items"]) == len(west) + len(east)


def test_a_run_on_us_west_2_launches_there_and_trains_to_succeeded(two: Harness, rig: Rig,
                                                                  west: dict[str, Any]) -> None:
    offers = two.ok("GET", "/api/catalog/gpus", params={"connection": "aws/us-west-2"})["items"]
    offer = next(o for o in offers if o["machine_type"] == "g5.xlarge")
    pid, dsid = two.project_and_dataset()
    run_id = two.ok("POST", "/api/runs", token="member", json_body={
        "project_id": pid, "dataset_version_id": dsid, "provider": "aws", "connection": "aws/us-west-2",
        "offer_id": offer["offer_id"], "base_model": SMOKE_MODEL, "price_limit_per_hour": 100.0,
        "runtime_limit_s": 3600})["id"]
    run = two.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], two.step_errors)
    [instance] = _instances(west["ec2"])
    assert _instances(rig.ec2) == []  # nothing in the default connection's region
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags["tensorant:run"] == run_id and tags["tensorant:connection"] == "aws/us-west-2"
    assert instance["Placement"]["AvailabilityZone"] == WEST_ZONE
    stored, _ = get_store().runs.get(two.org, run_id)
    assert stored.scope["region"] == WEST and stored.connection == "aws/us-west-2"
    # Scoped on its own: the connection holding the run may not move to another region, the default may change.
    status, body, _ = two.call("PUT", NAMED, json_body=rig.body(workspace_disk_gb=50))
    assert status == 409 and "region us-west-2 -> us-east-1" in str(body) and run_id in str(body)
    assert two.ok("GET", NAMED)["config"]["region"] == WEST
    assert two.call("PUT", "/api/connections/compute/aws", json_body=rig.body(workspace_disk_gb=60))[0] == 202
    two.drain()
    assert two.ok("GET", "/api/connections/compute/aws")["status"] == "connected"

    two.agent(run_id).train(trained_adapter_zip())
    run = two.get_run(run_id)
    assert run["state"] == "succeeded", (run["reason"], run["release_error"], two.step_errors)
    assert _instances(west["ec2"]) == []


def test_a_sweep_of_one_region_never_touches_the_others_machine(two: Harness, rig: Rig,
                                                                west: dict[str, Any]) -> None:
    offer = next(o for o in two.ok("GET", "/api/catalog/gpus", params={"connection": "aws/us-west-2"})["items"]
                 if o["machine_type"] == "g5.xlarge")
    pid, dsid = two.project_and_dataset()
    run_id = two.ok("POST", "/api/runs", token="member", json_body={
        "project_id": pid, "dataset_version_id": dsid, "provider": "aws", "connection": "aws/us-west-2",
        "offer_id": offer["offer_id"], "base_model": SMOKE_MODEL, "price_limit_per_hour": 100.0,
        "runtime_limit_s": 3600})["id"]
    assert two.launch(run_id)["state"] == "provisioning"
    [instance] = _instances(west["ec2"])
    # The run's record says it ended while its machine runs on (a lost release), past the grace period:
    # a leak of aws/us-west-2, which only that connection's sweep may judge and release.
    store = get_store()
    run, etag = store.runs.get(two.org, run_id)
    store.runs.put(run.model_copy(update={"state": RunState.failed}), etag)  # as written, not through the table
    two.clock.advance(get_settings().sweep_grace_s + 60)
    east = sweep_account.sweep_one(invocation(), two.org, "aws", sweep_id="s20260101000000-aaaaaa", dry_run=False)
    assert east["findings"] == [] and east["listed"] == 0
    assert _instances(west["ec2"])[0]["InstanceId"] == instance["InstanceId"]
    out = sweep_account.sweep_one(invocation(), two.org, "aws/us-west-2", sweep_id="s20260101000000-bbbbbb", dry_run=False)
    assert [(f["action"], f["run_id"], f["provider"]) for f in out["findings"]] == [
        ("release", run_id, "aws/us-west-2")], out
    assert _instances(west["ec2"]) == []


@pytest.fixture
def two_behind_proxy(env: dict[str, str], rig: Rig, west: dict[str, Any],
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Harness, RefusingProxy]]:
    """The two regions' connections with EC2 (moto) behind the refusing proxy (issue 37's failover)."""
    proxy = RefusingProxy(rig.url).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", rig.pricing.url)
    h = Harness()
    try:
        assert h.save_storage({"kind": "local"})["status"] == "connected"
        assert h.save_compute("aws", rig.body(workspace_disk_gb=50))["status"] == "connected"
        h.ok("PUT", NAMED, json_body=west["body"])
        h.drain()
        assert h.ok("GET", NAMED)["status"] == "connected"
        yield h, proxy
    finally:
        h.close()
        proxy.stop()


def test_a_capacity_refusal_in_us_east_1_fails_over_to_us_west_2_which_trains(
        two_behind_proxy: tuple[Harness, RefusingProxy], rig: Rig, west: dict[str, Any]) -> None:
    h, proxy = two_behind_proxy
    east_offer = next(o for o in h.ok("GET", "/api/catalog/gpus", params={"connection": "aws"})["items"]
                      if o["machine_type"] == "g6.xlarge")
    west_offer = next(o for o in h.ok("GET", "/api/catalog/gpus", params={"connection": "aws/us-west-2"})["items"]
                      if o["machine_type"] == "g5.xlarge")
    proxy.refuse["g6.xlarge"] = Refusal("InsufficientInstanceCapacity")
    pid, dsid = h.project_and_dataset()
    run_id = h.ok("POST", "/api/runs", token="member", json_body={
        "project_id": pid, "dataset_version_id": dsid, "base_model": SMOKE_MODEL, "price_limit_per_hour": 100.0,
        "runtime_limit_s": 3600, "candidates": [{"connection": "aws", "offer_id": east_offer["offer_id"]},
                                                {"connection": "aws/us-west-2", "offer_id": west_offer["offer_id"]}]})["id"]
    run = h.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], h.step_errors)
    run = h.get_run(run_id)
    assert [(a["connection"], a["outcome"], a["code"]) for a in run["attempts"]] == [
        ("aws", "refused", "InsufficientInstanceCapacity"), ("aws/us-west-2", "launched", "")]
    assert run["ran_on"]["connection"] == "aws/us-west-2"
    # The machine is in us-west-2, marked with the connection and the attempt; nothing is left in us-east-1.
    [instance] = _instances(west["ec2"])
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags["tensorant:connection"] == "aws/us-west-2" and tags["tensorant:attempt"] == "1"
    assert _instances(rig.ec2) == []
    stored, _ = get_store().runs.get(h.org, run_id)
    assert stored.scope["region"] == WEST
    h.agent(run_id).train(trained_adapter_zip())
    run = h.get_run(run_id)
    assert run["state"] == "succeeded", (run["reason"], run["release_error"], h.step_errors)
    assert _instances(west["ec2"]) == [] and _instances(rig.ec2) == []
