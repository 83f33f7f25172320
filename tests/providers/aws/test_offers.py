"""offers(): supported types in the subnet's zone, priced from (recorded) GetProducts pages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.errors import ProviderError
from tests.providers.aws.rig import Rig

EXPECTED = {  # type -> on-demand USD/hour in the recorded pages
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448, "g5.16xlarge": 4.096,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144, "g6.16xlarge": 3.3968,
    "g6e.xlarge": 1.861, "g6e.2xlarge": 2.24208, "g6e.4xlarge": 3.00424, "gr6.4xlarge": 1.5392, "p5.4xlarge": 6.88,
}


def test_offers_are_single_gpu_ampere_or_newer_with_disk(rig: Rig) -> None:
    offers = rig.compute().offers()
    by_type = {o.machine_type: o for o in offers}
    assert set(by_type) == set(EXPECTED)
    # Priced in the recorded pages but unsupported: T4 (g4dn), multi-GPU (g5.12xlarge).
    assert "g4dn.xlarge" not in by_type and "g5.12xlarge" not in by_type
    disk = (15 + 100) * 0.08 / 730  # moto's AMI root is 15 GiB, workspace 100 GiB, gp3 $0.08/GB-month
    for itype, price in EXPECTED.items():
        o = by_type[itype]
        assert o.compute_per_hour == pytest.approx(price)  # on-demand, not the Reserved term
        assert o.disk_per_hour == pytest.approx(disk, abs=1e-6)
        assert o.total_per_hour == pytest.approx(price + disk, abs=1e-6)
        assert (o.provider, o.region, o.zone, o.gpu_count) == ("aws", "us-east-1", "us-east-1a", 1)
        assert "Excludes NAT gateway, data transfer, taxes and account-specific discounts" in o.note
    assert by_type["g6e.xlarge"].gpu == "NVIDIA L40S" and by_type["p5.4xlarge"].gpu == "NVIDIA H100"
    assert by_type["g5.xlarge"].gpu_memory_gb == pytest.approx(22.4)


def test_pricing_queries_are_filtered_paginated_and_sent_to_us_east_1(rig: Rig, moto_ec2_url: str) -> None:
    import boto3

    # Train in us-west-2: the Pricing API is still called in us-east-1, with the training region in the filter.
    ec2 = boto3.client("ec2", endpoint_url=moto_ec2_url, region_name="us-west-2", aws_access_key_id="AKIAX" * 4,
                       aws_secret_access_key="x" * 40)
    vpc = ec2.create_vpc(CidrBlock="10.50.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.50.1.0/24", AvailabilityZone="us-west-2a")["Subnet"]
    sg = ec2.create_security_group(GroupName="g", Description="g", VpcId=vpc)["GroupId"]
    offers = rig.compute(region="us-west-2", subnet_id=subnet["SubnetId"], security_group_id=sg).offers()
    assert [o.machine_type for o in offers] == ["g5.xlarge"]  # the only us-west-2 type in the pages
    assert offers[0].compute_per_hour == pytest.approx(1.258)
    requests = rig.pricing.requests
    assert all("/us-east-1/pricing/aws4_request" in r["authorization"] for r in requests)
    assert all(r["target"] == "AWSPriceListService.GetProducts" for r in requests)
    compute_queries = [r["body"] for r in requests if any(f["Field"] == "instanceType" for f in r["body"]["Filters"])]
    filters = {(f["Field"], f["Value"]) for f in compute_queries[0]["Filters"] if f["Type"] == "TERM_MATCH"}
    assert filters == {("regionCode", "us-west-2"), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
                       ("preInstalledSw", "NA"), ("capacitystatus", "Used")}
    assert compute_queries[0]["ServiceCode"] == "AmazonEC2"


def test_pagination_follows_next_token(rig: Rig) -> None:
    rig.compute().offers()
    tokens = [r["body"].get("NextToken") for r in rig.pricing.requests]
    assert len(rig.pricing.requests) >= 4 and any(tokens)  # 15 priced types at 4 a page


def test_offers_raise_when_pricing_fails(rig: Rig) -> None:
    rig.pricing.fail_with = (500, "InternalErrorException")
    with pytest.raises(ProviderError):
        rig.compute().offers()


def test_fixture_pages_have_the_real_shape() -> None:
    from tests.providers.aws.pricing_server import FIXTURE

    pages = json.loads(FIXTURE.read_text())
    item: dict[str, Any] = json.loads(pages[0]["PriceList"][0])
    assert {"product", "terms", "serviceCode"} <= set(item)
    assert "OnDemand" in item["terms"] and "Reserved" in item["terms"]


def test_fractional_gpu_types_are_not_single_gpu_offers() -> None:
    from shared.providers.aws.catalog import supported_type

    def info(itype: str, **gpu: Any) -> dict[str, Any]:
        return {"InstanceType": itype, "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
                "SupportedUsageClasses": ["on-demand", "spot"], "VCpuInfo": {"DefaultVCpus": 4},
                "MemoryInfo": {"SizeInMiB": 16384},
                "GpuInfo": {"Gpus": [{"Name": "L4", "Manufacturer": "NVIDIA", "Count": 1, **gpu}]}}

    whole = supported_type(info("g6.xlarge", MemoryInfo={"SizeInMiB": 22888}))
    assert whole is not None and whole.gpu == "NVIDIA L4"
    assert supported_type(info("g6.xlarge", GpuPartitionSize=1.0, MemoryInfo={"SizeInMiB": 22888})) is not None
    # g6f.large: one eighth of an L4, as DescribeInstanceTypes reports it.
    assert supported_type(info("g6f.large", GpuPartitionSize=0.125, LogicalGpuCount=1,
                               MemoryInfo={"SizeInMiB": 2861})) is None
