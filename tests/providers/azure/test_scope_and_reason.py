"""Issue 12 on the fake ARM: the scope a run records (subscription, resource group, region), the
instance view's own words in describe, and the control-plane URL in the subnet check's egress list."""

from __future__ import annotations

from typing import Any

from shared.providers.azure.compute import AzureCompute
from shared.providers.azure.config import AzureConfig
from shared.providers.base import scope_differs, scope_of
from shared.settings import Settings
from tests.providers.azure.conftest import REF, SUB, TRAIN_RG, VM_ID, config_body, endpoints, make_compute, spec
from tests.providers.azure.fake_arm import FakeArm


def test_scope_is_subscription_resource_group_and_region(fake: FakeArm, compute: Any) -> None:
    assert scope_of(compute) == {"subscription": SUB, "resource_group": TRAIN_RG, "region": "eastus"}
    other = make_compute(fake, config=AzureConfig(**config_body(resource_group="Other-RG")))
    assert scope_differs(scope_of(compute), scope_of(other)) == {"resource_group": (TRAIN_RG, "other-rg")}
    same = make_compute(fake, config=AzureConfig(**config_body(resource_group=TRAIN_RG.upper())))
    assert scope_differs(scope_of(compute), scope_of(same)) == {}  # Azure RG names ignore case


def test_describe_reason_has_instance_view_agent_and_boot_diagnostics(fake: FakeArm, compute: Any) -> None:
    compute.launch(spec())
    desc = compute.describe(REF, [])
    assert f"VM {REF.name}: " in desc.reason and "VM running" in desc.reason
    assert "VM agent: not reporting" in desc.reason and "boot diagnostics: not enabled" in desc.reason
    vm = fake.get(VM_ID)
    assert vm is not None
    vm["_iv_extra"] = {
        "vmAgent": {"statuses": [{"code": "ProvisioningState/Unavailable", "displayStatus": "Not Ready",
                                  "message": "VM status blob is found but not yet populated."}]},
        "bootDiagnostics": {"status": {"code": "ProvisioningState/failed/BootDiagnosticsFailed",
                                       "message": "cloud-init: no datasource found"}},
    }
    reason = compute.describe(REF, []).reason
    assert "VM agent: Not Ready (VM status blob is found but not yet populated.)" in reason
    assert "boot diagnostics: ProvisioningState/failed/BootDiagnosticsFailed (cloud-init: no datasource found)" \
        in reason


def test_subnet_check_lists_the_control_plane_url(fake: FakeArm) -> None:
    compute = AzureCompute(AzureConfig(**config_body()),
                           Settings(deployment_id="test", public_url="https://tensorant.example.com"),
                           endpoints=endpoints(fake))
    subnet = {c.name: c for c in compute.validate()}["subnet"]
    assert "control plane at https://tensorant.example.com" in subnet.message and "heartbeats" in subnet.message
