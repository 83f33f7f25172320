"""On the fake ARM: the scope a run records (subscription, resource group, region), the
instance view's own words in describe, the serial console log's last lines (managed boot
diagnostics, console_of), and the control-plane URL in the subnet check's egress list."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shared.log import register_secret
from shared.providers.azure.compute import AzureCompute
from shared.providers.azure.config import AzureConfig
from shared.providers.base import LaunchSpec, RunRef, console_of, scope_differs, scope_of
from shared.settings import Settings
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import REF, SUB, TRAIN_RG, VM_ID, config_body, endpoints, make_compute, spec


def test_scope_is_subscription_resource_group_and_region(fake: FakeArm, compute: Any) -> None:
    assert scope_of(compute) == {"subscription": SUB, "resource_group": TRAIN_RG, "region": "eastus"}
    other = make_compute(fake, config=AzureConfig(**config_body(resource_group="Other-RG")))
    assert scope_differs(scope_of(compute), scope_of(other)) == {"resource_group": (TRAIN_RG, "other-rg")}
    same = make_compute(fake, config=AzureConfig(**config_body(resource_group=TRAIN_RG.upper())))
    assert scope_differs(scope_of(compute), scope_of(same)) == {}  # Azure RG names ignore case


def booted_spec(ref: RunRef = REF) -> LaunchSpec:
    """The rig's spec with the control-plane URL the bootstrap's failure report needs."""
    base = spec(ref)
    return replace(base, bootstrap=replace(base.bootstrap, env={**base.bootstrap.env,
                                                                  "TENSORANT_API_URL": "https://cp.example.com"}))


def test_describe_reason_has_instance_view_agent_and_boot_diagnostics(fake: FakeArm, compute: Any) -> None:
    compute.launch(booted_spec())
    desc = compute.describe(REF, [])
    assert f"VM {REF.name}: " in desc.reason and "VM running" in desc.reason
    assert "VM agent: not reporting" in desc.reason and "boot diagnostics: not enabled" not in desc.reason
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


def test_vm_is_created_with_managed_boot_diagnostics(fake: FakeArm, compute: Any) -> None:
    compute.launch(booted_spec())
    (body,) = [b for m, p, _, b in fake.requests if m == "PUT" and p.lower() == VM_ID.lower()]
    assert body["properties"]["diagnosticsProfile"] == {"bootDiagnostics": {"enabled": True}}  # no storageUri
    assert "boot diagnostics: not enabled" not in compute.describe(REF, []).reason


def test_console_output_is_the_tail_of_the_serial_log(fake: FakeArm, compute: Any) -> None:
    assert console_of(compute, REF, []) == ""  # no VM: nothing to read
    compute.launch(booted_spec())
    register_secret("run-token-value-0123456789")
    lines = [f"[  {i}.000000] boot line {i} " + "x" * 100 for i in range(300)]  # ~35 KB: only the end is read
    lines += ["\x1b[1;31mdocker: Error response from daemon: pull access denied\x1b[0m",
              "tensorant-boot: reporting with Authorization: Bearer run-token-value-0123456789",
              "curl https://acct.blob.core.windows.net/c/x?sv=2024&sig=SECRETSIG", "", "the last line"]
    fake.set_console(VM_ID, "\r\n".join(lines))
    text = console_of(compute, REF, [])
    assert text.startswith(f"Azure boot diagnostics, serial console log of VM {REF.name} (last lines):\n"), text
    assert text.endswith("docker: Error response from daemon: pull access denied\n"
                         "tensorant-boot: reporting with Authorization: Bearer ***\n"
                         "curl https://acct.blob.core.windows.net/c/x?***\nthe last line"), text
    assert "run-token-value" not in text and "SECRETSIG" not in text and "boot line 290" not in text
    assert len(text) <= 1600
    # One HEAD for the size, then one ranged GET of the end only.
    assert [m for m, _ in fake.blob_reads] == ["HEAD", "GET"]
    size = len("\r\n".join(lines).encode())
    assert fake.blob_reads[1][1] == f"bytes={size - 8192}-{size - 1}"
    posts = [p for m, p, _, _ in fake.requests if m == "POST" and "/oauth2/" not in p]
    assert posts == [f"{VM_ID}/retrieveBootDiagnosticsData"]


def test_console_output_unavailable_never_raises(fake: FakeArm, compute: Any) -> None:
    compute.launch(booted_spec())
    fake.fail("POST", r"/retrievebootdiagnosticsdata$", 403, "AuthorizationFailed",
              message="The client does not have authorization to perform action "
                      "'Microsoft.Compute/virtualMachines/retrieveBootDiagnosticsData/action'")
    text = console_of(compute, REF, [])
    assert text.startswith("console output unavailable: ") and "the training role needs" in text, text
    # A VM created without boot diagnostics (before they were enabled) says so, without asking Azure.
    vm = fake.get(VM_ID)
    assert vm is not None
    vm["properties"].pop("diagnosticsProfile")
    assert console_of(compute, REF, []) == f"console output unavailable: boot diagnostics are not enabled on VM {REF.name}"
    # The serial log's own endpoint failing (the SAS host unreachable, a 5xx) is no exception either.
    vm["properties"]["diagnosticsProfile"] = {"bootDiagnostics": {"enabled": True}}
    fake.sas.clear()
    original = fake._vm_action

    def stale_sas(vm_id: str, action: str, method: str) -> Any:
        status, headers, body = original(vm_id, action, method)
        fake.sas.clear()  # the SAS is no longer valid when it is read
        return status, headers, body

    fake._vm_action = stale_sas  # type: ignore[method-assign]
    text = console_of(compute, REF, [])
    assert text == "console output unavailable: the serial console log answered HTTP 403", text
    assert "sig=" not in text


def test_subnet_check_lists_the_control_plane_url(fake: FakeArm) -> None:
    compute = AzureCompute(AzureConfig(**config_body()),
                           Settings(deployment_id="test", public_url="https://tensorant.example.com"),
                           endpoints=endpoints(fake))
    subnet = {c.name: c for c in compute.validate()}["subnet"]
    assert "control plane at https://tensorant.example.com" in subnet.message and "heartbeats" in subnet.message
