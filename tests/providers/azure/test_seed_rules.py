"""Rules of the Azure product document that were implemented without a test (issue 41.16)."""

from __future__ import annotations

from typing import Any

from shared.models import CheckStatus
from shared.providers.azure.config import AzureConfig
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import (
    GALLERY_VERSION_ID,
    IMAGE_ID,
    REF,
    VM_ID,
    config_body,
    make_compute,
    spec,
)


def checks(compute: Any) -> dict[str, Any]:
    return {c.name: c for c in compute.validate()}


def test_a_missing_resource_group_says_create_it(fake: FakeArm) -> None:
    """'Create a dedicated resource group for Tensorant training resources.'"""
    fake.fail("GET", r"/providers/microsoft.compute/virtualmachines$", 404, "ResourceGroupNotFound",
              message="Resource group 'train-rg' could not be found.")
    auth = checks(make_compute(fake))["authentication"]
    assert auth.status == CheckStatus.fail
    assert "does not exist" in auth.message and "create the dedicated training resource group" in auth.message


def test_a_managed_image_with_data_disks_is_refused(fake: FakeArm) -> None:
    """'... a generalized x64 Gen2 version with the same contents and no data disks.'"""
    image = fake.get(IMAGE_ID)
    assert image
    image["properties"]["storageProfile"]["dataDisks"] = [{"lun": 0, "diskSizeGB": 32}]
    got = checks(make_compute(fake))["image"]
    assert got.status == CheckStatus.fail and "data disks" in got.message and "only an OS disk" in got.message


def test_a_gallery_version_with_data_disks_is_refused(fake: FakeArm) -> None:
    version = fake.get(GALLERY_VERSION_ID)
    assert version
    version["properties"]["storageProfile"]["dataDiskImages"] = [{"lun": 0, "sizeInGB": 32}]
    got = checks(make_compute(fake, config=AzureConfig(**config_body(image_id=GALLERY_VERSION_ID))))["image"]
    assert got.status == CheckStatus.fail and "data disks" in got.message


def test_a_managed_image_works_only_in_its_own_region(fake: FakeArm) -> None:
    image = fake.get(IMAGE_ID)
    assert image
    image["location"] = "westus2"
    got = checks(make_compute(fake))["image"]
    assert got.status == CheckStatus.fail and "only create VMs in its own region" in got.message
    assert "gallery version replicated there" in got.message


def test_stopped_without_deallocation_says_it_still_bills(fake: FakeArm) -> None:
    """'Stopped without deallocation can still incur compute charges.'"""
    compute = make_compute(fake)
    resources = compute.launch(spec())
    vm = fake.get(VM_ID)
    assert vm
    vm["_state"] = {"power": "stopped"}  # powered off inside Azure, not deallocated
    described = compute.describe(REF, resources)
    assert "stopped without deallocation still bills compute" in described.detail, described.detail
    vm["_state"] = {"power": "deallocated"}
    assert "still bills" not in compute.describe(REF, resources).detail
