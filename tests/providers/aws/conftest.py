"""AWS test rig: moto in server mode on loopback (the real wire protocol), AMIs seeded
through MOTO_AMIS_PATH, the Pricing API answered from recorded pages, and a counter of
every AWS request the adapter makes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.providers.aws.pricing_server import PricingServer

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


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    amis_file = tmp_path_factory.mktemp("moto") / "amis.json"
    amis_file.write_text(json.dumps(SEEDED_AMIS))
    old = os.environ.get("MOTO_AMIS_PATH")
    # Must be set before moto's EC2 backend loads its AMI list.
    os.environ["MOTO_AMIS_PATH"] = str(amis_file)
    if "moto.ec2.models.amis" in sys.modules:  # another test loaded moto's EC2 first
        sys.modules["moto.ec2.models.amis"].AMIS = json.loads(amis_file.read_text())
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


@pytest.fixture(scope="session")
def pricing_server() -> Iterator[PricingServer]:
    server = PricingServer().start()
    yield server
    server.stop()


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

    def on_api_call(self, service: str, operation: str, params: dict[str, Any]) -> Any:
        for listener in list(self.listeners):
            answer = listener(service, operation, params)
            if answer is not None:
                return answer
        return None

    def config(self, **over: Any) -> Any:
        from shared.providers.aws.config import AwsConfig

        values: dict[str, Any] = {
            "region": REGION, "access_key_id": "AKIAIOSFODNN7EXAMPLE",
            "secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "ami_id": AMI_GOOD,
            "subnet_id": self.subnet_id, "security_group_id": self.sg_id, "workspace_disk_gb": 100,
        }
        values.update(over)
        return AwsConfig(**values)

    def compute(self, deployment: str = "test", page_size: int = 100,
                sleep: Callable[[float], None] = lambda s: None, **over: Any) -> Any:
        from shared.providers.aws.compute import AwsCompute
        from shared.settings import Settings

        return AwsCompute(self.config(**over), Settings(deployment_id=deployment), endpoint_url=self.url,
                          pricing_endpoint_url=self.pricing.url, sleep=sleep, on_api_call=self.on_api_call,
                          page_size=page_size)


@pytest.fixture
def rig(moto_server: str, pricing_server: PricingServer) -> Iterator[Rig]:
    import boto3
    import requests

    requests.post(f"{moto_server}/moto-api/reset", timeout=10).raise_for_status()
    pricing_server.requests.clear()
    pricing_server.fail_with = None
    kw = {"endpoint_url": moto_server, "region_name": REGION, "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE",
          "aws_secret_access_key": "x" * 40}
    ec2 = boto3.client("ec2", **kw)
    iam = boto3.client("iam", **kw)
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24", AvailabilityZone=ZONE)["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName="tensorant-train", Description="training", VpcId=vpc)["GroupId"]
    log = CallLog()
    yield Rig(moto_server, pricing_server, log, ec2, iam, subnet, sg, vpc, listeners=[log])


@pytest.fixture(scope="session", autouse=True)
def _policy_covers_every_call() -> Iterator[None]:
    """At the end of the session, every AWS action any test made must be granted by infra/aws."""
    yield
    if not ALL_ACTIONS:
        return
    from tests.providers.aws.policy import not_granted

    missing = not_granted(ALL_ACTIONS)
    assert not missing, f"the adapter called actions the IAM policy template does not grant: {missing}"


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


@pytest.fixture
def injected(rig: Rig) -> list[Any]:
    """The rig's listener list: add inject(...) listeners with add_injection."""
    return rig.listeners


def add_injection(injected: list[Any], listener: Any) -> None:
    # After the counter (first in the rig's list), so injected calls are still counted.
    injected.append(listener)
