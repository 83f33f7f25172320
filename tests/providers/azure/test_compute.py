"""The lifecycle (compute.py) with the real azure-identity / azure-mgmt clients against the fake ARM server."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from shared.errors import (
    AuthError,
    CapacityError,
    PermanentError,
    QuotaError,
    RetryableError,
)
from shared.models import MachineState
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from tests.providers.azure.fake_arm import SUB, FakeArm
from tests.providers.azure.rig import (
    DISK_ID,
    NIC_ID,
    REF,
    SUBNET_ID,
    TRAIN_RG,
    VM_ID,
    config_body,
    make_compute,
    spec,
    writes,
)

# ---------------------------------------------------------------- launch


def test_launch_creates_private_vm_with_marks_and_is_idempotent(fake: FakeArm, compute: Any) -> None:
    first = compute.launch(spec())
    second = compute.launch(spec())
    assert [r.id for r in first] == [r.id for r in second] == [VM_ID, DISK_ID, NIC_ID]
    assert len(fake.of_type("Microsoft.Compute/virtualMachines")) == 1
    assert len([1 for m, p in writes(fake) if m == "PUT" and "virtualmachines" in p.lower()]) == 1

    vm, nic, disk = fake.get(VM_ID), fake.get(NIC_ID), fake.get(DISK_ID)
    assert vm and nic and disk
    for res in (vm, nic, disk):
        assert res["tags"] == REF.tags
    props = vm["properties"]
    os_disk = props["storageProfile"]["osDisk"]
    assert os_disk["managedDisk"]["storageAccountType"] == "Premium_LRS" and os_disk["diskSizeGB"] == 128
    assert os_disk["deleteOption"] == "Delete" and os_disk["name"] == f"{REF.name}-osdisk"
    assert props["storageProfile"]["dataDisks"] == []
    assert props["storageProfile"]["imageReference"]["id"] == config_body()["image_id"]
    assert props["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"] == "Delete"
    profile = vm["_os_profile"]
    assert profile["adminUsername"] == "tensorant" and "adminPassword" not in profile
    assert profile["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert profile["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == config_body()["ssh_public_key"]
    user_data = base64.b64decode(vm["_custom_data"]).decode()
    assert user_data.startswith("#cloud-config") and "ghcr.io/tensorant/trainer:1" in user_data
    ipcfg = nic["properties"]["ipConfigurations"][0]["properties"]
    assert ipcfg["subnet"]["id"] == SUBNET_ID and "publicIPAddress" not in ipcfg
    # the customer's network and image are only read
    assert not [p for _, p in writes(fake) if "virtualnetworks" in p.lower() or "/images/" in p.lower()]


@pytest.mark.parametrize("enabled", [True, False])
def test_accelerated_networking_only_where_the_size_has_it(fake: FakeArm, compute: Any, enabled: bool) -> None:
    """Issue 41.15: the NIC asked for accelerated networking whatever the size; a size without the
    AcceleratedNetworkingEnabled capability fails at create."""
    for sku in fake.skus:
        if sku.get("name") == "Standard_NC24ads_A100_v4":
            for cap in sku["capabilities"]:
                if cap["name"] == "AcceleratedNetworkingEnabled":
                    cap["value"] = str(enabled)
    compute.launch(spec())
    nic = fake.get(NIC_ID)
    assert nic and nic["properties"]["enableAcceleratedNetworking"] is enabled


@pytest.mark.parametrize(("security", "sent"), [("TrustedLaunch", "TrustedLaunch"),
                                                ("TrustedLaunchSupported", "Standard"), (None, "Standard")])
def test_a_gallery_image_launches_with_the_security_type_its_definition_requires(
        fake: FakeArm, security: str | None, sent: str) -> None:
    """Issue 41.12: a Trusted-Launch-only image was sent securityType Standard, which Azure refuses with 400."""
    from shared.providers.azure.config import AzureConfig
    from tests.providers.azure.rig import GALLERY_IMAGE, GALLERY_VERSION_ID

    definition = fake.get(GALLERY_IMAGE)
    assert definition
    if security:
        definition["properties"]["features"] = [{"name": "SecurityType", "value": security}]
    compute = make_compute(fake, config=AzureConfig(**config_body(image_id=GALLERY_VERSION_ID)))
    compute.launch(spec())
    vm = fake.get(VM_ID)
    assert vm and vm["properties"]["securityProfile"]["securityType"] == sent
    if sent == "TrustedLaunch":
        assert vm["properties"]["securityProfile"]["uefiSettings"] == {"secureBootEnabled": False, "vTpmEnabled": True}


def test_a_confidential_only_image_is_refused_before_anything_is_created(fake: FakeArm) -> None:
    from shared.providers.azure.config import AzureConfig
    from tests.providers.azure.rig import GALLERY_IMAGE, GALLERY_VERSION_ID

    definition = fake.get(GALLERY_IMAGE)
    assert definition
    definition["properties"]["features"] = [{"name": "SecurityType", "value": "ConfidentialVM"}]
    compute = make_compute(fake, config=AzureConfig(**config_body(image_id=GALLERY_VERSION_ID)))
    with pytest.raises(PermanentError, match="TrustedLaunchSupported"):
        compute.launch(spec())
    assert not writes(fake)


def test_allocation_failure_cleans_up_vm_disk_and_nic(fake: FakeArm, compute: Any) -> None:
    fake.allocation_failure = "AllocationFailed"
    with pytest.raises(CapacityError) as info:
        compute.launch(spec())
    assert "capacity" in info.value.reason and info.value.code == "AllocationFailed"
    assert fake.get(VM_ID) is None and fake.get(DISK_ID) is None and fake.get(NIC_ID) is None
    # the VM resource existed (in a Failed state) and was deleted
    assert ("DELETE", VM_ID) in writes(fake)


def test_failed_vm_found_by_a_retried_launch_is_cleaned_up(fake: FakeArm) -> None:
    fake.allocation_failure = "OverconstrainedAllocationRequest"
    compute = make_compute(fake, lro_wait_s=0.05)
    resources = launch_while_held(fake, compute)  # Azure has not answered yet: resources are recorded, not failed
    assert [r.kind for r in resources] == ["vm", "disk", "nic"]
    fake.finish_ops()  # let Azure finish: the allocation fails, leaving the VM resource
    assert fake.get(VM_ID)["properties"]["provisioningState"] == "Failed"  # type: ignore[index]
    assert compute.describe(REF, resources).state == MachineState.unknown
    with pytest.raises(CapacityError):
        make_compute(fake).launch(spec())
    assert fake.get(VM_ID) is None and fake.get(NIC_ID) is None and fake.get(DISK_ID) is None


def test_bootstrap_that_cannot_render_creates_nothing(fake: FakeArm, compute: Any) -> None:
    # The environment is not in the custom data (the machine exchanges a claim for it); the image and the
    # control plane's URL are, written as they are.
    for image, env in (("ghcr.io/tensorant/trainer:1\nruncmd: [x]", {}),
                       ("ghcr.io/tensorant/trainer:1", {"TENSORANT_API_URL": "https://cp\u2028x"})):
        bad = spec()
        bad = LaunchSpec(ref=bad.ref, offer=bad.offer,
                         bootstrap=Bootstrap(container_image=image, env={**bad.bootstrap.env, **env}))
        with pytest.raises(PermanentError) as info:
            compute.launch(bad)
        assert "custom data" in info.value.reason
    assert writes(fake) == []  # no NIC (or anything else) was created
    assert fake.get(NIC_ID) is None


# OperationNotAllowed as Azure words it: quota is one of its meanings, read from the message.
QUOTA_MESSAGE = ("Operation could not be completed as it results in exceeding approved Total Regional Cores quota. "
                 "Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 10, "
                 "Current Usage: 0, Additional Required: 36, (Minimum) New Limit Required: 36.")


def test_create_refusals_translate_and_leave_no_nic(fake: FakeArm) -> None:
    cases = [(409, "SkuNotAvailable", CapacityError, "SkuNotAvailable happened"),
             (409, "QuotaExceeded", QuotaError, "QuotaExceeded happened"),
             (409, "OperationNotAllowed", QuotaError, QUOTA_MESSAGE),
             (409, "OperationNotAllowed", PermanentError, "Boot diagnostics storage account is not supported."),
             (403, "AuthorizationFailed", AuthError, "AuthorizationFailed happened"),
             (400, "InvalidParameter", PermanentError, "InvalidParameter happened")]
    for status, code, exc, message in cases:
        fake.fail("PUT", r"/virtualmachines/", status, code, message=message)
        with pytest.raises(exc) as info:
            make_compute(fake).launch(spec())
        assert info.value.code == code
        assert exc is QuotaError or not isinstance(info.value, QuotaError), (code, message)
        if exc is not AuthError:  # without permission, cleanup cannot run either; release/sweeper retry
            assert fake.get(NIC_ID) is None, code
    assert fake.get(VM_ID) is None


@pytest.mark.parametrize("message", [
    "Operation 'start' is not allowed on VM 'tensorant-x' since the VM is marked for deletion. You can only retry "
    "the Delete operation (or wait for an ongoing one to complete).",
    "Disk tensorant-x-os is attached to VM /subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/"
    "virtualMachines/tensorant-x."])
def test_operation_not_allowed_that_is_not_quota_is_no_quota_error(message: str) -> None:
    from azure.core.exceptions import HttpResponseError

    from shared.errors import RetryableError
    from shared.providers.azure.errors import translate

    err = HttpResponseError(message=message)
    err.status_code = 409
    err.error = type("E", (), {"code": "OperationNotAllowed", "message": message})()  # as ARM's body parses
    got = translate(err, "creating the VM")
    assert isinstance(got, RetryableError) and not isinstance(got, QuotaError), got
    assert "quota" not in got.reason.lower()


def test_unsupported_size_refused_before_any_call(fake: FakeArm, compute: Any) -> None:
    with pytest.raises(PermanentError, match="not a supported"):
        compute.launch(spec(size="Standard_NV12ads_A10_v5"))
    assert writes(fake) == []


# ---------------------------------------------------------------- retain / start / release


def test_retain_deallocates_and_keeps_disk_then_start(fake: FakeArm, compute: Any) -> None:
    compute.launch(spec())
    out = compute.retain(REF, [])
    assert out.done and "deallocated" in out.detail
    assert "disk" in out.billing_note and "still bill" in out.billing_note
    assert fake.get(VM_ID)["_state"]["power"] == "deallocated"  # type: ignore[index]
    assert fake.get(DISK_ID) is not None
    assert any(p.lower().endswith("/deallocate") for _, p in writes(fake))
    assert not any(p.lower().endswith("/poweroff") for _, p in writes(fake))
    assert compute.describe(REF, []).state == MachineState.stopped
    assert compute.retain(REF, []).done  # again: already deallocated, no second request
    assert sum(1 for _, p in writes(fake) if p.lower().endswith("/deallocate")) == 1
    started = compute.start(REF, [])
    assert started.done and fake.get(VM_ID)["_state"]["power"] == "running"  # type: ignore[index]


def test_retain_not_done_until_azure_confirms(fake: FakeArm) -> None:
    make_compute(fake).launch(spec())
    fake.hold_ops = True
    compute = make_compute(fake, lro_wait_s=0.05)
    out = compute.retain(REF, [])
    assert not out.done and "deallocating" in out.detail
    again = compute.retain(REF, [])  # still deallocating: no second deallocate request
    assert not again.done
    assert sum(1 for _, p in writes(fake) if p.lower().endswith("/deallocate")) == 1
    fake.finish_ops()
    assert compute.retain(REF, []).done


def test_release_deletes_vm_then_confirms_disk_and_nic_gone(fake: FakeArm, compute: Any, sim_clock: Any) -> None:
    compute.launch(spec())
    compute.retain(REF, [])
    fake.keep_nic_on_vm_delete = True  # as if Azure had not applied the NIC's delete option
    assert not compute.release(REF, []).done  # the NIC stays reserved for its VM for 180 s
    sim_clock.advance(fake.nic_reserved_s + 1)
    out = compute.release(REF, [])
    assert out.done
    assert fake.get(VM_ID) is None and fake.get(DISK_ID) is None and fake.get(NIC_ID) is None
    deletes = [p for m, p in writes(fake) if m == "DELETE"]
    assert "/Microsoft.DevTestLab/schedules/shutdown-computevm-" in deletes[0]  # the VM's auto-shutdown first
    deletes = deletes[1:]
    assert deletes[0] == VM_ID and deletes[-1] == NIC_ID
    # confirmation: a GET answering 404 for each resource after the deletes
    gets_after = [p for m, p, _, _ in fake.requests[-6:] if m == "GET"]
    assert {VM_ID, DISK_ID, NIC_ID} <= set(gets_after)
    assert compute.release(REF, []).done  # missing = success


def test_release_waits_while_nic_is_reserved(fake: FakeArm, compute: Any, sim_clock: Any) -> None:
    # The fake answers as Azure does (400 NicReservedForAnotherVm for 180 s after the VM went), by itself.
    compute.launch(spec())
    fake.keep_nic_on_vm_delete = True
    first = compute.release(REF, [])
    assert not first.done and "reserved" in first.detail and first.retry_after_s >= 30
    assert fake.get(VM_ID) is None and fake.get(NIC_ID) is not None
    refused = [r for r in fake.requests if r[0] == "DELETE" and "networkinterfaces" in r[1].lower()]
    assert refused, fake.requests
    sim_clock.advance(60)
    assert not compute.release(REF, []).done
    sim_clock.advance(fake.nic_reserved_s)
    assert compute.release(REF, []).done and fake.get(NIC_ID) is None


def test_release_not_done_while_vm_delete_runs(fake: FakeArm) -> None:
    make_compute(fake).launch(spec())
    fake.hold_ops = True
    out = make_compute(fake, lro_wait_s=0.05).release(REF, [])
    assert not out.done and fake.get(VM_ID) is not None
    fake.finish_ops()
    assert make_compute(fake).release(REF, []).done


def test_release_refuses_vm_whose_disk_was_swapped(fake: FakeArm, compute: Any) -> None:
    compute.launch(spec())
    compute.retain(REF, [])
    vm = fake.get(VM_ID)
    assert vm
    swapped = f"/subscriptions/{SUB}/resourceGroups/{TRAIN_RG}/providers/Microsoft.Compute/disks/rescue-copy"
    vm["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"] = swapped
    with pytest.raises(PermanentError) as info:
        compute.release(REF, [])
    assert info.value.code == "AttachmentsChanged" and "OS disk was replaced" in info.value.reason
    assert fake.get(VM_ID) is not None and not [m for m, _ in writes(fake) if m == "DELETE"]


def test_release_refuses_vm_with_extra_data_disk(fake: FakeArm, compute: Any) -> None:
    compute.launch(spec())
    data_id = f"/subscriptions/{SUB}/resourceGroups/{TRAIN_RG}/providers/Microsoft.Compute/disks/extra"
    fake.get(VM_ID)["properties"]["storageProfile"]["dataDisks"] = [  # type: ignore[index]
        {"lun": 0, "name": "extra", "createOption": "Attach", "managedDisk": {"id": data_id}}]
    with pytest.raises(PermanentError, match="data disk"):
        compute.release(REF, [])
    assert fake.get(VM_ID) is not None


def test_release_refuses_disk_attached_to_a_helper_vm(fake: FakeArm, compute: Any) -> None:
    compute.launch(spec())
    fake.resources.pop(VM_ID.lower())  # the run VM went away by hand; its disk now serves a helper VM
    fake.get(DISK_ID)["managedBy"] = VM_ID.replace(REF.name, "helper")  # type: ignore[index]
    with pytest.raises(PermanentError, match="attached to"):
        compute.release(REF, [])
    assert fake.get(DISK_ID) is not None


def test_never_touches_resources_without_our_tags(fake: FakeArm, compute: Any) -> None:
    fake.put(VM_ID, {"location": "eastus", "tags": {"owner": "someone"}, "properties": {}})
    with pytest.raises(PermanentError, match="without this run's tags"):
        compute.launch(spec())
    with pytest.raises(PermanentError):
        compute.release(REF, [])
    with pytest.raises(PermanentError):
        compute.retain(REF, [])
    assert writes(fake) == []


# ---------------------------------------------------------------- list_managed


def test_list_managed_pages_and_filters_by_deployment(fake: FakeArm, compute: Any) -> None:
    for i in range(3):
        compute.launch(spec(RunRef("test", "org1", f"r{i}")))
    other = make_compute(fake)
    other.settings = other.settings.model_copy(update={"deployment_id": "other"})
    other.launch(spec(RunRef("other", "org9", "x1")))
    # an OS disk not tagged yet (crash before the tag PATCH) is still found by its deterministic name
    orphan = f"/subscriptions/{SUB}/resourceGroups/{TRAIN_RG}/providers/Microsoft.Compute/disks/tensorant-test-r9-osdisk"
    fake.put(orphan, {"location": "eastus", "tags": {}, "properties": {"diskState": "Unattached"}})
    fake.put(orphan.replace("tensorant-test-r9", "customer"), {"location": "eastus", "tags": {}, "properties": {}})
    found = list(compute.list_managed())
    kinds = sorted((r.kind, r.run_id) for r in found)
    assert kinds == sorted([(k, f"r{i}") for i in range(3) for k in ("vm", "disk", "nic")] + [("disk", "r9")])
    assert all(r.deployment == "test" and r.provider == "azure" for r in found)
    assert all(r.org == "org1" for r in found if r.run_id != "r9")
    assert any(r.created_at is not None for r in found if r.kind == "vm")
    lists = [q for m, p, q, _ in fake.requests if m == "GET" and p.lower().endswith("/virtualmachines")]
    assert any("skiptoken" in q for q in lists)  # followed nextLink (page size 2)


def launch_while_held(fake: FakeArm, compute: Any) -> list[Any]:
    """A launch while Azure holds every operation: the network interface is not ready, so the first
    launch asks to be called again (nothing recorded, nothing waited on past the bound); the next one,
    once the NIC is ready, creates the VM and returns its resources while the VM create still runs."""
    fake.hold_ops = True
    with pytest.raises(RetryableError) as info:
        compute.launch(spec())
    assert info.value.code == "InProgress" and "still being created" in info.value.reason
    assert fake.get(NIC_ID) is not None and fake.get(VM_ID) is None
    fake.finish_ops()
    fake.hold_ops = True
    resources: list[Any] = compute.launch(spec())
    assert fake.get(VM_ID) is not None
    return resources


def test_slow_create_returns_resources_and_describe_tags_the_disk(fake: FakeArm) -> None:
    compute = make_compute(fake, lro_wait_s=0.05)
    assert [r.kind for r in launch_while_held(fake, compute)] == ["vm", "disk", "nic"]  # bounded, no failure
    assert compute.describe(REF, []).state == MachineState.pending
    fake.finish_ops()
    assert fake.get(DISK_ID)["tags"] == {}  # type: ignore[index]  # Azure made the disk without tags
    assert compute.describe(REF, []).state == MachineState.running
    assert fake.get(DISK_ID)["tags"] == REF.tags  # type: ignore[index]
