"""The AWS test rig: moto in server mode on loopback (the real wire protocol) with AMIs seeded
through MOTO_AMIS_PATH, the Pricing API answered from recorded pages, a counter of every AWS
request the adapter makes, and injected answers for what moto cannot produce.

The fixtures built on it are in tests/conftest.py (moto_ec2_url, pricing_server, rig: the e2e
tests and tests/test_security_imds.py use them too) and tests/providers/aws/conftest.py.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.providers.aws.pricing_server import PricingServer

if TYPE_CHECKING:
    from shared.providers.aws.compute import AwsCompute
    from shared.providers.aws.config import AwsConfig

REGION = "us-east-1"
ZONE = "us-east-1a"
ACCOUNT = "123456789012"  # moto's default account
AMI_GOOD = "ami-0a1b2c3d4e5f60001"
AMI_MARKETPLACE = "ami-0a1b2c3d4e5f60002"
AMI_ARM = "ami-0a1b2c3d4e5f60003"
AMI_INSTANCE_STORE = "ami-0a1b2c3d4e5f60004"
AMI_WINDOWS = "ami-0a1b2c3d4e5f60005"
AMI_PENDING = "ami-0a1b2c3d4e5f60006"


def _ami(ami_id: str, name: str, **over: Any) -> dict[str, Any]:
    ami = {"ami_id": ami_id, "name": name, "description": name, "owner_id": ACCOUNT, "public": False,
           "virtualization_type": "hvm", "architecture": "x86_64", "state": "available", "platform": None,
           "image_type": "machine", "hypervisor": "xen", "root_device_name": "/dev/sda1",
           "root_device_type": "ebs", "sriov": "simple", "region_name": ZONE}
    ami.update(over)
    return ami


SEEDED_AMIS = [
    _ami(AMI_GOOD, "tensorant-dlami-ubuntu-24.04"),
    _ami(AMI_MARKETPLACE, "marketplace-gpu-image",
         product_codes=[{"ProductCodeId": "4k3rdzjmcn6u2ua4mtarketpl", "ProductCodeType": "marketplace"}]),
    _ami(AMI_ARM, "arm64-gpu-image", architecture="arm64"),
    _ami(AMI_INSTANCE_STORE, "instance-store-image", root_device_type="instance-store"),
    _ami(AMI_WINDOWS, "windows-gpu-image", platform="windows"),
    _ami(AMI_PENDING, "still-being-created", state="pending"),
]


@contextmanager
def moto_ec2_server(workdir: Path) -> Iterator[str]:
    """moto in server mode on a loopback port, its EC2 seeded with SEEDED_AMIS; yields its URL."""
    amis_file = workdir / "amis.json"
    amis_file.write_text(json.dumps(SEEDED_AMIS))
    old = os.environ.get("MOTO_AMIS_PATH")
    # Must be set before moto's EC2 backend loads its AMI list.
    os.environ["MOTO_AMIS_PATH"] = str(amis_file)
    if "moto.ec2.models.amis" in sys.modules:  # another test loaded moto's EC2 first
        from moto.ec2.models import amis

        amis.AMIS = json.loads(amis_file.read_text())
    from moto import settings as moto_settings
    from moto.server import ThreadedMotoServer

    moto_settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION = True
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    moto_settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION = False
    if old is None:
        os.environ.pop("MOTO_AMIS_PATH", None)
    else:
        os.environ["MOTO_AMIS_PATH"] = old


@dataclass
class CallLog:
    calls: list[tuple[str, str]] = field(default_factory=list)
    params: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, service: str, operation: str, params: dict[str, Any]) -> None:
        self.calls.append((service, operation))
        self.params.append(params)
        ALL_ACTIONS.add(f"{service}:{operation}")

    def take(self) -> list[tuple[str, str]]:
        out, self.calls = self.calls, []
        self.params = []
        return out


# Every action any AWS test made, checked against the IAM policy template at session end.
ALL_ACTIONS: set[str] = set()


@dataclass
class Rig:
    url: str
    pricing: PricingServer
    log: CallLog
    ec2: Any
    iam: Any
    subnet_id: str
    sg_id: str
    vpc_id: str
    # Called in order before every AWS request of computes built by `compute()`; the first
    # that answers short-circuits the request (see inject). The call counter comes first.
    listeners: list[Any] = field(default_factory=list)
    ebs_default_key: str = "alias/aws/ebs"  # what GetEbsDefaultKmsKeyId answers (ebs_default_key)
    # What GetServiceQuota answers (service_quotas): quota code -> vCPUs; None = the optional grant is absent.
    quotas: dict[str, float] | None = None

    def on_api_call(self, service: str, operation: str, params: dict[str, Any]) -> Any:
        for listener in list(self.listeners):
            answer = listener(service, operation, params)
            if answer is not None:
                return answer
        return None

    def body(self, **over: Any) -> dict[str, Any]:
        """The aws connection's body on this rig's network, as a user saves it."""
        return {"region": REGION, "access_key_id": "AKIAIOSFODNN7EXAMPLE",
                "secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "ami_id": AMI_GOOD,
                "subnet_id": self.subnet_id, "security_group_id": self.sg_id, "workspace_disk_gb": 100, **over}

    def config(self, **over: Any) -> AwsConfig:
        from shared.providers.aws.config import AwsConfig

        return AwsConfig(**self.body(**over))

    def compute(self, deployment: str = "test", page_size: int = 100,
                sleep: Callable[[float], None] = lambda s: None, **over: Any) -> AwsCompute:
        from shared.providers.aws.compute import AwsCompute
        from shared.settings import Settings

        return AwsCompute(self.config(**over), Settings(deployment_id=deployment), endpoint_url=self.url,
                          pricing_endpoint_url=self.pricing.url, sleep=sleep, on_api_call=self.on_api_call,
                          page_size=page_size)


def new_rig(module_s3_url: str, pricing: PricingServer) -> Rig:
    """A rig on a freshly reset moto and pricing fake: one VPC with a subnet in ZONE and a security group."""
    import boto3
    import requests

    requests.post(f"{module_s3_url}/moto-api/reset", timeout=10).raise_for_status()
    pricing.requests.clear()
    pricing.fail_with = None
    kw = {"endpoint_url": module_s3_url, "region_name": REGION, "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE",
          "aws_secret_access_key": "x" * 40}
    ec2 = boto3.client("ec2", **kw)
    iam = boto3.client("iam", **kw)
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24", AvailabilityZone=ZONE)["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName="tensorant-train", Description="training", VpcId=vpc)["GroupId"]
    log = CallLog()
    rig = Rig(module_s3_url, pricing, log, ec2, iam, subnet, sg, vpc, listeners=[log])
    rig.listeners.append(ebs_default_key(rig))
    rig.quotas = dict(DEFAULT_QUOTAS)
    rig.listeners.append(service_quotas(rig))
    return rig


def ebs_default_key(rig: Rig) -> Any:
    """GetEbsDefaultKmsKeyId, which moto does not implement: EC2's answer for rig.ebs_default_key."""
    def listener(svc: str, op: str, params: dict[str, Any]) -> Any:
        if svc == "ec2" and op == "GetEbsDefaultKmsKeyId":
            return _Http(200), {"KmsKeyId": rig.ebs_default_key, "ResponseMetadata": {"HTTPStatusCode": 200}}
        return None

    return listener


class _Http:
    def __init__(self, status: int) -> None:
        self.status_code = status
        self.headers: dict[str, str] = {}
        self.content = b""


def inject(service: str, operation: str, code: str = "", message: str = "", *, status: int = 400,
           times: int | None = None, response: dict[str, Any] | None = None) -> Any:
    """A before-call listener that answers `operation` itself (an AWS error, or `response`).

    This is the test-only hook for what moto cannot produce (capacity, quota, throttling,
    root credentials): botocore's before-call event short-circuits the request on the real
    client, and every other call still goes to moto.
    """
    state = {"left": times}

    def listener(svc: str, op: str, params: dict[str, Any]) -> Any:
        if svc != service or op != operation or state["left"] == 0:
            return None
        if state["left"] is not None:
            state["left"] -= 1
        if response is not None:
            return _Http(200), {**response, "ResponseMetadata": {"HTTPStatusCode": 200}}
        return _Http(status), {"Error": {"Code": code, "Message": message},
                               "ResponseMetadata": {"HTTPStatusCode": status}}

    return listener


def add_injection(injected: list[Any], listener: Any) -> None:
    # After the counter (first in the rig's list), so injected calls are still counted.
    injected.append(listener)


def strict_client_token(ec2: Any) -> Any:
    """RunInstances' ClientToken as EC2 keeps it (moto ignores it): the same token with other
    parameters is IdempotentParameterMismatch; with the same ones, the instance it created."""
    seen: dict[str, dict[str, Any]] = {}  # the wire form of the first request with each token

    def listener(svc: str, op: str, params: dict[str, Any]) -> Any:
        body = params.get("body") or {}
        if svc != "ec2" or op != "RunInstances" or not body.get("ClientToken"):
            return None
        token = body["ClientToken"]
        if token not in seen:
            seen[token] = dict(body)
            return None
        if seen[token] != body:
            return _Http(400), {"Error": {"Code": "IdempotentParameterMismatch", "Message": (
                f"Client token {token} was used with different parameters")}, "ResponseMetadata": {
                "HTTPStatusCode": 400}}
        run = next(v for k, v in body.items() if k.startswith("TagSpecification.1.Tag.") and k.endswith(".Value")
                   and body[k[:-len("Value")] + "Key"] == "tensorant:run")
        found = [i for r in ec2.describe_instances(Filters=[
            {"Name": "tag:tensorant:run", "Values": [run]}])["Reservations"] for i in r["Instances"]]
        return _Http(200), {"Instances": found[:1], "ResponseMetadata": {"HTTPStatusCode": 200}}

    return listener



# What GetServiceQuota answers on a new rig (Rig.quotas): the grant is present, both GPU families at 64 vCPUs.
DEFAULT_QUOTAS = {"L-DB2E81BA": 64.0, "L-417A185B": 64.0}


def service_quotas(rig: Rig, *, region: str = REGION) -> Any:
    """Service Quotas' GetServiceQuota for EC2's quota codes, which moto does not serve (its
    servicequotas backend knows only `vpc` and answers NoSuchResourceException for every EC2 code):
    the smallest honest fake, answering in the API's own response shape (a `Quota` object with the
    code, name, ARN and applied `Value`) from rig.quotas. rig.quotas None: the optional grant is absent,
    every call is refused with AccessDeniedException as IAM refuses it."""
    from shared.providers.aws.quotas import FAMILIES

    def listener(svc: str, op: str, params: dict[str, Any]) -> Any:
        if svc != "servicequotas" or op != "GetServiceQuota":
            return None
        body = params.get("body") or {}
        if isinstance(body, bytes | str):
            body = json.loads(body or "{}")
        code = str(body.get("QuotaCode", ""))
        values = rig.quotas
        if values is None:
            return _Http(400), {"Error": {"Code": "AccessDeniedException", "Message": (
                f"User: arn:aws:iam::{ACCOUNT}:user/tensorant is not authorized to perform: "
                f"servicequotas:GetServiceQuota on resource: arn:aws:servicequotas:{region}:{ACCOUNT}:ec2/{code}")},
                "ResponseMetadata": {"HTTPStatusCode": 400}}
        if body.get("ServiceCode") != "ec2" or code not in values:
            return _Http(400), {"Error": {"Code": "NoSuchResourceException", "Message": (
                "The request failed because the specified resource does not exist.")},
                "ResponseMetadata": {"HTTPStatusCode": 400}}
        return _Http(200), {"Quota": {
            "ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "QuotaArn": f"arn:aws:servicequotas:{region}:{ACCOUNT}:ec2/{code}", "QuotaCode": code,
            "QuotaName": FAMILIES.get(code, ("", ()))[0], "Value": float(values[code]), "Unit": "None",
            "Adjustable": True, "GlobalQuota": False}, "ResponseMetadata": {"HTTPStatusCode": 200}}

    return listener
