"""The Azure test rig: a fake ARM server seeded with one subscription's image, network, SKUs,
quotas and prices, and AzureComputes whose real SDK clients talk to it.

The fixtures built on it are `fake` and `compute` (tests/providers/azure/conftest.py) and `arm`
and `azure_h` (tests/conftest.py: the e2e tests and tests/test_connection_scope.py use them too).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from shared import clock
from shared.models import GpuOffer
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from tests.providers.azure.fake_arm import CLIENT, SECRET, SUB, TENANT, FakeArm
from tests.support.clock import FakeClock

if TYPE_CHECKING:
    from shared.providers.azure.client import AzureEndpoints
    from shared.providers.azure.compute import AzureCompute

TRAIN_RG = "tensorant-training"
IMAGE_ID = f"/subscriptions/{SUB}/resourceGroups/images-rg/providers/Microsoft.Compute/images/tensorant-gpu-v1"
GALLERY_IMAGE = f"/subscriptions/{SUB}/resourceGroups/images-rg/providers/Microsoft.Compute/galleries/g1/images/tgpu"
GALLERY_VERSION_ID = f"{GALLERY_IMAGE}/versions/1.0.0"
VNET_ID = f"/subscriptions/{SUB}/resourceGroups/net-rg/providers/Microsoft.Network/virtualNetworks/vnet1"
SUBNET_ID = f"{VNET_ID}/subnets/training"


def ed25519_pub() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + " me@x"


def rsa_pub(bits: int) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=bits).public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


SSH_KEY = ed25519_pub()


def config_body(**over: Any) -> dict[str, Any]:
    body = {
        "tenant_id": TENANT, "client_id": CLIENT, "client_secret": SECRET, "subscription_id": SUB,
        "resource_group": TRAIN_RG, "region": "eastus", "subnet_id": SUBNET_ID, "image_id": IMAGE_ID,
        "ssh_public_key": SSH_KEY, "os_disk_gb": 128,
    }
    body.update(over)
    return body


def _sku(name: str, family: str, vcpus: int, gpus: int = 1, restrictions: list[Any] | None = None,
         arch: str = "x64", accelerated: bool = True) -> dict[str, Any]:
    return {
        "resourceType": "virtualMachines", "name": name, "tier": "Standard", "size": name.split("_", 1)[1],
        "family": family, "locations": ["eastus"],
        "locationInfo": [{"location": "eastus", "zones": ["1", "2", "3"]}],
        "capabilities": [{"name": "vCPUs", "value": str(vcpus)}, {"name": "GPUs", "value": str(gpus)},
                         {"name": "HyperVGenerations", "value": "V1,V2"},
                         {"name": "CpuArchitectureType", "value": arch},
                         {"name": "AcceleratedNetworkingEnabled", "value": str(accelerated)}],
        "restrictions": restrictions or [],
    }


def _vm_price(sku: str, price: float, **over: Any) -> dict[str, Any]:
    item = {"currencyCode": "USD", "retailPrice": price, "unitPrice": price, "armRegionName": "eastus",
            "location": "US East", "meterName": sku.split("_", 1)[1].replace("_", " "),
            "productName": "Virtual Machines NCads A100 v4 Series", "skuName": sku.split("_", 1)[1].replace("_", " "),
            "serviceName": "Virtual Machines", "armSkuName": sku, "priceType": "Consumption",
            "unitOfMeasure": "1 Hour", "type": "Consumption"}
    item.update(over)
    return item


def _disk_price(tier: str, price: float, meter: str = "") -> dict[str, Any]:
    return {"currencyCode": "USD", "retailPrice": price, "unitPrice": price, "armRegionName": "eastus",
            "meterName": meter or f"{tier} LRS Disk", "productName": "Premium SSD Managed Disks",
            "skuName": f"{tier} LRS", "serviceName": "Storage", "armSkuName": "", "priceType": "Consumption",
            "unitOfMeasure": "1/Month", "type": "Consumption"}


def seed(fake: FakeArm) -> None:
    fake.put(IMAGE_ID, {"type": "Microsoft.Compute/images", "location": "eastus", "properties": {
        "hyperVGeneration": "V2", "provisioningState": "Succeeded",
        "storageProfile": {"osDisk": {"osType": "Linux", "osState": "Generalized"}, "dataDisks": []}}})
    fake.put(GALLERY_IMAGE, {"type": "Microsoft.Compute/galleries/images", "location": "westus2", "properties": {
        "osType": "Linux", "osState": "Generalized", "hyperVGeneration": "V2", "architecture": "x64",
        "identifier": {"publisher": "me", "offer": "t", "sku": "gpu"}}})
    fake.put(GALLERY_VERSION_ID, {"type": "Microsoft.Compute/galleries/images/versions", "location": "westus2",
                                  "properties": {"provisioningState": "Succeeded", "publishingProfile": {
                                      "targetRegions": [{"name": "West US 2"}, {"name": "East US"}]},
                                      "storageProfile": {"osDiskImage": {"sizeInGB": 64}}}})
    fake.put(VNET_ID, {"type": "Microsoft.Network/virtualNetworks", "location": "eastus",
                       "properties": {"addressSpace": {"addressPrefixes": ["10.0.0.0/16"]}}})
    fake.put(SUBNET_ID, {"type": "Microsoft.Network/virtualNetworks/subnets", "properties": {
        "addressPrefix": "10.0.1.0/24", "natGateway": {"id": "/subscriptions/x/natGateways/nat"}}})
    not_for_sub = [{"type": "Location", "values": ["eastus"], "reasonCode": "NotAvailableForSubscription",
                    "restrictionInfo": {"locations": ["eastus"]}}]
    fake.skus = [
        _sku("Standard_NV36ads_A10_v5", "standardNVADSA10v5Family", 36),
        _sku("Standard_NV36adms_A10_v5", "standardNVADSA10v5Family", 36, restrictions=not_for_sub),
        _sku("Standard_NV12ads_A10_v5", "standardNVADSA10v5Family", 12),  # fractional: never offered
        _sku("Standard_NC24ads_A100_v4", "StandardNCADSA100v4Family", 24),
        _sku("Standard_NC48ads_A100_v4", "StandardNCADSA100v4Family", 48, gpus=2),  # multi-GPU
        _sku("Standard_NC40ads_H100_v5", "standardNCadsH100v5Family", 40),
        _sku("Standard_NC4as_T4_v3", "standardNCASv3_T4Family", 4),  # T4: unsupported
        {"resourceType": "disks", "name": "Premium_LRS", "locations": ["eastus"]},
    ]
    fake.usages = [
        {"currentValue": 10, "limit": 100, "name": {"value": "cores", "localizedValue": "Total Regional vCPUs"},
         "unit": "Count"},
        {"currentValue": 0, "limit": 36, "name": {"value": "standardNVADSA10v5Family"}, "unit": "Count"},
        {"currentValue": 0, "limit": 24, "name": {"value": "StandardNCADSA100v4Family"}, "unit": "Count"},
        {"currentValue": 0, "limit": 0, "name": {"value": "standardNCadsH100v5Family"}, "unit": "Count"},
    ]
    fake.price_items = [
        _vm_price("Standard_NC24ads_A100_v4", 3.673),
        _vm_price("Standard_NC24ads_A100_v4", 0.73, meterName="NC24ads A100 v4 Spot", skuName="NC24ads A100 v4 Spot"),
        _vm_price("Standard_NC24ads_A100_v4", 0.9, meterName="NC24ads A100 v4 Low Priority",
                  skuName="NC24ads A100 v4 Low Priority"),
        _vm_price("Standard_NC24ads_A100_v4", 4.5, productName="Virtual Machines NCads A100 v4 Series Windows"),
        _vm_price("Standard_NC24ads_A100_v4", 2.2, priceType="Reservation", type="Reservation",
                  unitOfMeasure="1 Hour"),
        _vm_price("Standard_NV36ads_A10_v5", 3.2),
        _vm_price("Standard_NV36adms_A10_v5", 4.0),
        _vm_price("Standard_NV12ads_A10_v5", 0.9),
        _vm_price("Standard_NC40ads_H100_v5", 6.98),
        _vm_price("Standard_NC40ads_H100_v5", 6.98, armRegionName="westus2"),
        _disk_price("P10", 19.71),
        _disk_price("P10", 1.0, meter="P10 LRS Disk Mount"),
        _disk_price("P15", 38.01),
        _disk_price("P30", 135.17),
    ]


def seeded_arm(workdir: Path) -> FakeArm:
    """A started fake ARM server (its state under `workdir`), seeded; the caller stops it."""
    arm = FakeArm(workdir).start()
    seed(arm)
    return arm


def _simulated() -> FakeClock | None:
    """The core's clock when a test simulates it (tests.harness.Harness installs one), else None."""
    current = clock._now
    return current if isinstance(current, FakeClock) else None


def sim_sleep(seconds: float) -> None:
    """An inline throttling retry's sleep: moves the simulated clock (so tests can measure it), never waits."""
    fake_clock = _simulated()
    if fake_clock is not None:
        fake_clock.advance(seconds)


def sim_pause(fake: FakeArm) -> Callable[[Any, float], None]:
    """A slice of a long-running operation's wait. On the wall clock: the real wait. On a simulated
    clock: an operation the fake will complete at its next poll is waited for in real time (its
    poller thread polls, then reads the result) without moving the clock; otherwise the clock moves
    by the slice, as Azure's time passes while the operation runs."""

    def pause(poller: Any, seconds: float) -> None:
        fake_clock = _simulated()
        if fake_clock is None:
            poller.wait(timeout=seconds)
            return
        if fake.latest_op_due():
            poller.wait(timeout=2.0)
            if poller.done():
                return
        fake_clock.advance(seconds)

    return pause


def endpoints(fake: FakeArm, **over: Any) -> AzureEndpoints:
    """AzureEndpoints pointing every client at the fake (the keyword-only `endpoints` of AzureCompute),
    waiting on the simulated clock where a test has one (sim_sleep, sim_pause)."""
    from shared.providers.azure.client import AzureEndpoints

    values: dict[str, Any] = dict(arm_url=fake.url, authority=fake.url, prices_url=f"{fake.url}/api/retail/prices",
                                  verify=fake.cert, retry_total=0, polling_interval=0, lro_wait_s=5.0,
                                  sleep=sim_sleep, pause=sim_pause(fake),
                                  blob_host=re.escape(fake.url.removeprefix("https://")))
    values.update(over)
    return AzureEndpoints(**values)


def make_compute(fake: FakeArm, **over: Any) -> AzureCompute:
    from shared.providers.azure.compute import AzureCompute
    from shared.providers.azure.config import AzureConfig
    from shared.settings import Settings

    cfg = over.pop("config", None) or AzureConfig(**config_body())
    return AzureCompute(cfg, Settings(deployment_id="test"), endpoints=endpoints(fake, **over))


def route_registry_to(fake: FakeArm) -> Callable[[], None]:
    """Make the registry build azure providers as AzureCompute(config, settings, endpoints=<the fake>),
    through its one test hook, registry.override; returns the undo for the fixture's teardown."""
    from shared.providers import registry
    from shared.providers.azure.compute import AzureCompute
    from shared.providers.azure.config import AzureConfig
    from shared.providers.base import ComputeProvider
    from shared.settings import Settings

    def factory(config: BaseModel, settings: Settings) -> ComputeProvider:
        assert isinstance(config, AzureConfig)
        return AzureCompute(config, settings, endpoints=endpoints(fake))

    return registry.override("azure", factory=factory)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# ---------------------------------------------------------------- one run's names and launch spec

REF = RunRef(deployment="test", org="org1", run_id="run-abc")
VM_ID = f"/subscriptions/{SUB}/resourceGroups/{TRAIN_RG}/providers/Microsoft.Compute/virtualMachines/{REF.name}"
DISK_ID = f"/subscriptions/{SUB}/resourceGroups/{TRAIN_RG}/providers/Microsoft.Compute/disks/{REF.name}-osdisk"
NIC_ID = f"/subscriptions/{SUB}/resourceGroups/{TRAIN_RG}/providers/Microsoft.Network/networkInterfaces/{REF.name}-nic"


def offer(size: str = "Standard_NC24ads_A100_v4") -> GpuOffer:
    return GpuOffer(provider="azure", offer_id=f"azure:eastus:{size}", gpu="A100", gpu_memory_gb=80,
                    machine_type=size, region="eastus", compute_per_hour=3.6, disk_per_hour=0.03, total_per_hour=3.63)


def spec(ref: RunRef = REF, size: str = "Standard_NC24ads_A100_v4") -> LaunchSpec:
    boot = Bootstrap(container_image="ghcr.io/tensorant/trainer:1",
                     env={"TENSORANT_RUN_ID": ref.run_id, "TENSORANT_RUN_TOKEN": "tok-secret-123456",
                          "TENSORANT_API_URL": "https://cp.example.com"},
                     secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"}))
    return LaunchSpec(ref=ref, offer=offer(size), bootstrap=boot)


def writes(fake: FakeArm) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _, _ in fake.requests if m in ("PUT", "PATCH", "DELETE", "POST")
            and "/oauth2/" not in p]
