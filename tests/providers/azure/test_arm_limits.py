"""What Azure refuses or does slowly where a first real run depends on it, answered by the fake ARM server
as Azure does (fake_arm.py), and what the provider sends: the OS disk's tag update is long-running (202,
polled to its end within a bound), the VM's custom data and names stay within Azure's limits and a launch
that would break them is refused before anything is created."""

from __future__ import annotations

import math
from typing import Any

import pytest

from shared.clock import now_ts
from shared.errors import PermanentError
from shared.ids import newest_first_id
from shared.providers import cloudinit
from shared.providers.azure.compute import CUSTOM_DATA_MAX_BYTES
from shared.providers.base import RunRef
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import DISK_ID, NIC_ID, REF, TRAIN_RG, VM_ID, make_compute, spec, writes
from tests.support.clock import FakeClock


def refusal(exc: Any) -> tuple[str, str, str]:
    """(code, target, message) of the ARM error an SDK call raised."""
    assert exc.error is not None, exc
    return str(exc.error.code), str(exc.error.target), str(exc.error.message)


def disk_patches(fake: FakeArm) -> list[str]:
    return [p for m, p in writes(fake) if m == "PATCH" and "/disks/" in p]


# ---------------------------------------------------------------- the OS disk's tag update is long-running


def test_the_disk_tag_update_is_polled_to_its_end_before_launch_returns(fake: FakeArm,
                                                                         sim_clock: FakeClock) -> None:
    """Azure answers the disk PATCH 202 and applies it when its operation completes (here 3 s later, on the
    simulated clock, which moves only while the provider waits): a launch that did not wait for the
    operation would return with the disk still unmarked."""
    fake.disk_update_s = 3
    make_compute(fake, lro_wait_s=20).launch(spec())
    assert disk_patches(fake) == [DISK_ID]
    after = fake.requests[[p for _, p, _, _ in fake.requests].index(DISK_ID) + 1:]
    assert any(m == "GET" and "/operations/" in p for m, p, _, _ in after), "the update's operation was not polled"
    disk = fake.get(DISK_ID)
    assert disk and disk["tags"] == REF.tags


def test_a_slow_disk_update_is_waited_on_within_the_bound_then_found_done(fake: FakeArm,
                                                                          sim_clock: FakeClock) -> None:
    fake.disk_update_s = 600
    compute = make_compute(fake, lro_wait_s=5)
    started = now_ts()
    compute.launch(spec())
    assert now_ts() - started <= 5 + 1  # the wait is bounded (lro_wait_s), the launch goes on
    disk = fake.get(DISK_ID)
    assert disk and disk["tags"] == {}  # not applied yet: Azure is still updating
    sim_clock.advance(600)
    compute.describe(REF, [])
    disk = fake.get(DISK_ID)
    assert disk and disk["tags"] == REF.tags
    assert len(disk_patches(fake)) == 1  # the finished update was seen, not sent again


# ---------------------------------------------------------------- custom data


def test_the_fake_refuses_custom_data_over_azures_limit_as_azure_does(fake: FakeArm, compute: Any) -> None:
    import base64

    from azure.core.exceptions import HttpResponseError

    # the run's NIC, then VM creates sent as they are, past the provider's own check
    fake.put(NIC_ID, {"location": "eastus", "tags": REF.tags, "properties": {"ipConfigurations": []}})
    vms = compute.client.compute().virtual_machines
    body = compute._vm_body(REF, "Standard_NC24ads_A100_v4", 128, base64.b64encode(b"x" * 65536).decode())
    with pytest.raises(HttpResponseError) as info:
        vms.begin_create_or_update(TRAIN_RG, REF.name, body)
    code, target, message = refusal(info.value)
    assert info.value.status_code == 400 and code == "InvalidParameter"
    assert target == "customData" and "87380" in message
    body = compute._vm_body(REF, "Standard_NC24ads_A100_v4", 128, "not base64!")
    with pytest.raises(HttpResponseError) as info:
        vms.begin_create_or_update(TRAIN_RG, REF.name, body)
    assert refusal(info.value)[1] == "customData"
    # exactly at the limit it is accepted
    body = compute._vm_body(REF, "Standard_NC24ads_A100_v4", 128, base64.b64encode(b"x" * 65535).decode())
    vms.begin_create_or_update(TRAIN_RG, REF.name, body).result()
    assert fake.get(VM_ID) is not None


def test_launch_refuses_custom_data_azure_would_refuse_before_creating_anything(
        fake: FakeArm, compute: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cloudinit, "render", lambda bootstrap, claim: "#cloud-config\n" + "#" * 70_000)
    with pytest.raises(PermanentError) as info:
        compute.launch(spec())
    assert info.value.code == "BadBootstrap" and "65535" in info.value.reason
    assert writes(fake) == []  # no NIC made and cleaned up again


def test_the_bootstrap_bound_is_within_azures_custom_data_limit() -> None:
    assert cloudinit.MAX_USER_DATA <= CUSTOM_DATA_MAX_BYTES
    assert 4 * math.ceil(CUSTOM_DATA_MAX_BYTES / 3) == 87380  # the base64 length Azure's message names


# ---------------------------------------------------------------- names


def test_the_fake_refuses_names_over_azures_limits_as_azure_does(fake: FakeArm, compute: Any) -> None:
    from azure.core.exceptions import HttpResponseError

    compute.launch(spec())
    vms = compute.client.compute().virtual_machines
    body = compute._vm_body(REF, "Standard_NC24ads_A100_v4", 128, "")
    with pytest.raises(HttpResponseError) as info:
        vms.begin_create_or_update(TRAIN_RG, "v" * 65, body)
    assert refusal(info.value)[:2] == ("InvalidParameter", "vmName")
    body["properties"]["osProfile"]["computerName"] = "has_underscore"
    with pytest.raises(HttpResponseError) as info:
        vms.begin_create_or_update(TRAIN_RG, "tensorant-test-other", body)
    assert refusal(info.value)[:2] == ("InvalidParameter", "computerName")


def test_the_longest_names_a_run_can_have_fit_azures_limits(fake: FakeArm) -> None:
    """A deployment id of the most characters settings allow and a run id as ids.py makes them."""
    from shared.settings import Settings

    deployment = "d" * 31
    assert Settings(deployment_id=deployment).deployment_id == deployment  # the longest the settings accept
    ref = RunRef(deployment, "org1", newest_first_id("r"))
    compute = make_compute(fake)
    compute.settings = Settings(deployment_id=deployment)
    vm, nic, disk = compute.names(ref)
    assert len(vm) <= 64 and len(nic) <= 80 and len(disk) <= 80
    assert [r.kind for r in compute.launch(spec(ref))] == ["vm", "disk", "nic"]  # the fake would refuse more


def test_a_name_azure_would_refuse_is_refused_before_anything_is_made(fake: FakeArm, compute: Any) -> None:
    ref = RunRef("test", "org1", "r-" + "0" * 60)  # 75 characters as a VM name
    with pytest.raises(PermanentError) as info:
        compute.launch(spec(ref))
    assert info.value.code == "BadName"
    assert writes(fake) == []
