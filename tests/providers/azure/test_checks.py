"""The connection checks (checks.py) through AzureCompute.validate, against the fake ARM server."""

from __future__ import annotations

from typing import Any

from shared.models import CheckStatus
from shared.providers.azure.config import AzureConfig
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import (
    GALLERY_IMAGE,
    GALLERY_VERSION_ID,
    SUBNET_ID,
    VNET_ID,
    config_body,
    make_compute,
    writes,
)


def checks(compute: Any) -> dict[str, Any]:
    return {c.name: c for c in compute.validate()}


def test_validate_all_good_and_starts_nothing(fake: FakeArm, compute: Any) -> None:
    result = checks(compute)
    assert [result[n].status for n in ("authentication", "image", "subnet", "gpu_sizes", "prices")] == \
        [CheckStatus.ok] * 5
    assert "Standard_NV36adms_A10_v5: NotAvailableForSubscription" in result["gpu_sizes"].message
    assert "NV12ads" not in result["gpu_sizes"].message and "T4" not in result["gpu_sizes"].message
    # H100 family quota is 0: a warning, and it says quota does not reserve capacity
    assert result["quota"].status == CheckStatus.warn
    assert "standardNCadsH100v5Family" in result["quota"].message
    assert "does not reserve" in result["quota"].message
    assert writes(fake) == []


def test_validate_wrong_secret_fails_authentication_with_hint(fake: FakeArm) -> None:
    fake.client_secret = "another-value~0123456789"
    result = make_compute(fake).validate()
    assert [c.name for c in result] == ["authentication"]
    assert result[0].status == CheckStatus.fail and "Value (not its Secret ID)" in result[0].message


def test_validate_missing_role_assignment(fake: FakeArm) -> None:
    fake.fail("GET", r"/resourcegroups/tensorant-training/providers/microsoft.compute/virtualmachines$", 403,
              "AuthorizationFailed", message="does not have authorization")
    auth = make_compute(fake).validate()[0]
    assert auth.status == CheckStatus.fail and "Tensorant Training Resources" in auth.message


def test_validate_image_problems(fake: FakeArm) -> None:
    image = fake.get(config_body()["image_id"])
    assert image is not None
    image["properties"]["hyperVGeneration"] = "V1"
    image["properties"]["storageProfile"]["osDisk"]["osType"] = "Windows"
    msg = checks(make_compute(fake))["image"].message
    assert "Gen2" in msg and "not Linux" in msg


def test_validate_gallery_version_not_replicated_and_arm(fake: FakeArm) -> None:
    version, definition = fake.get(GALLERY_VERSION_ID), fake.get(GALLERY_IMAGE)
    assert version and definition
    version["properties"]["publishingProfile"]["targetRegions"] = [{"name": "West US 2"}]
    definition["properties"]["architecture"] = "Arm64"
    cfg = AzureConfig(**config_body(image_id=GALLERY_VERSION_ID))
    image = checks(make_compute(fake, config=cfg))["image"]
    assert image.status == CheckStatus.fail
    assert "not replicated to eastus" in image.message and "x64" in image.message


def test_validate_gallery_version_ok(fake: FakeArm) -> None:
    cfg = AzureConfig(**config_body(image_id=GALLERY_VERSION_ID))
    assert checks(make_compute(fake, config=cfg))["image"].status == CheckStatus.ok


def test_validate_os_disk_smaller_than_image(fake: FakeArm) -> None:
    cfg = AzureConfig(**config_body(image_id=GALLERY_VERSION_ID, os_disk_gb=32))
    image = checks(make_compute(fake, config=cfg))["image"]
    assert image.status == CheckStatus.fail and "at least 64" in image.message


def test_validate_subnet_in_other_region_and_missing(fake: FakeArm) -> None:
    vnet = fake.get(VNET_ID)
    assert vnet
    vnet["location"] = "westeurope"
    sub = checks(make_compute(fake))["subnet"]
    assert sub.status == CheckStatus.fail and "westeurope" in sub.message
    fake.resources.pop(SUBNET_ID.lower())
    assert "not found" in checks(make_compute(fake))["subnet"].message


def test_validate_subnet_without_nat_is_a_warning(fake: FakeArm) -> None:
    subnet = fake.get(SUBNET_ID)
    assert subnet
    subnet["properties"].pop("natGateway")
    assert checks(make_compute(fake))["subnet"].status == CheckStatus.warn


def test_validate_no_supported_size_in_region(fake: FakeArm) -> None:
    for sku in fake.skus:
        sku["restrictions"] = [{"type": "Zone", "values": ["eastus"], "reasonCode": "NotAvailableForSubscription",
                                "restrictionInfo": {"zones": ["1", "2", "3"]}}]
    result = checks(make_compute(fake))
    assert result["gpu_sizes"].status == CheckStatus.fail and "every zone" in result["gpu_sizes"].message


def test_validate_unregistered_resource_provider(fake: FakeArm) -> None:
    fake.fail("GET", r"/providers/microsoft.compute/skus$", 409, "MissingSubscriptionRegistration",
              message="The subscription is not registered to use namespace 'Microsoft.Compute'.")
    sizes = checks(make_compute(fake))["gpu_sizes"]
    assert sizes.status == CheckStatus.fail and "Resource providers" in sizes.message
    # The SDK's automatic registration is off (issue 41.14): registering is an administrator's task.
    assert not [r for r in fake.requests if r[0] == "POST" and r[1].lower().endswith("/register")], fake.requests


# ---------------------------------------------------------------- a gallery in another subscription

OTHER_SUB = "22222222-3333-4444-5555-666666666666"
OTHER_GALLERY = f"/subscriptions/{OTHER_SUB}/resourceGroups/shared-images/providers/Microsoft.Compute/galleries/corp"
OTHER_VERSION_ID = f"{OTHER_GALLERY}/images/tgpu/versions/1.0.0"


def seed_other_subscription_gallery(fake: FakeArm) -> AzureConfig:
    """The seeded gallery image and version, copied into a gallery in another subscription of the tenant."""
    definition, version = fake.get(GALLERY_IMAGE), fake.get(GALLERY_VERSION_ID)
    assert definition and version
    fake.put(f"{OTHER_GALLERY}/images/tgpu", {k: v for k, v in definition.items() if k not in ("id", "name")})
    fake.put(OTHER_VERSION_ID, {k: v for k, v in version.items() if k not in ("id", "name")})
    return AzureConfig(**config_body(image_id=OTHER_VERSION_ID))


def test_gallery_in_another_subscription_without_a_grant_says_what_to_do(fake: FakeArm) -> None:
    """The Tensorant roles are assignable only in the training subscription: the check must not tell the
    owner to assign them at a gallery elsewhere, but name the two ways that work."""
    cfg = seed_other_subscription_gallery(fake)
    image = checks(make_compute(fake, config=cfg))["image"]
    assert image.status == CheckStatus.fail
    assert f"subscription {OTHER_SUB}" in image.message and "AuthorizationFailed" in image.message
    assert "Reader role" in image.message and OTHER_GALLERY in image.message  # (1) a read grant at that gallery
    assert "az sig image-version create" in image.message  # (2) or a copy in the training subscription
    # the fake answered as ARM does, and the check read nothing else there
    assert [m for m, p, _, _ in fake.requests if OTHER_SUB in p] == ["GET"]
    assert writes(fake) == []


def test_gallery_in_another_subscription_readable_passes(fake: FakeArm) -> None:
    cfg = seed_other_subscription_gallery(fake)
    fake.foreign_read_scopes.append(OTHER_GALLERY)  # Reader assigned at the gallery in its own subscription
    assert checks(make_compute(fake, config=cfg))["image"].status == CheckStatus.ok


def test_a_vm_from_another_subscriptions_gallery_needs_the_read_grant_too(fake: FakeArm) -> None:
    """ARM's linked access check: creating the VM reads the image version in its subscription."""
    import pytest

    from shared.errors import AuthError
    from tests.providers.azure.rig import spec

    cfg = seed_other_subscription_gallery(fake)
    with pytest.raises(AuthError) as info:
        make_compute(fake, config=cfg).launch(spec())
    # The launch reads the image definition first (its security type, issue 41.12), so it is refused there,
    # before anything is created; without that read ARM's linked check refuses the VM create.
    assert info.value.code in ("AuthorizationFailed", "LinkedAuthorizationFailed")
    assert writes(fake) == []
    fake.foreign_read_scopes.append(OTHER_GALLERY)
    assert make_compute(fake, config=cfg).launch(spec())


# ---------------------------------------------------------------- Trusted Launch (issue 41.12)


def test_a_trusted_launch_only_definition_is_read_and_named(fake: FakeArm) -> None:
    definition = fake.get(GALLERY_IMAGE)
    assert definition
    definition["properties"]["features"] = [{"name": "SecurityType", "value": "TrustedLaunch"}]
    cfg = AzureConfig(**config_body(image_id=GALLERY_VERSION_ID))
    image = checks(make_compute(fake, config=cfg))["image"]
    assert image.status == CheckStatus.ok and "Trusted Launch only" in image.message, image.message


def test_a_confidential_vm_definition_is_refused_at_the_check_with_the_fix(fake: FakeArm) -> None:
    definition = fake.get(GALLERY_IMAGE)
    assert definition
    definition["properties"]["features"] = [{"name": "SecurityType", "value": "ConfidentialVM"}]
    cfg = AzureConfig(**config_body(image_id=GALLERY_VERSION_ID))
    image = checks(make_compute(fake, config=cfg))["image"]
    assert image.status == CheckStatus.fail and "TrustedLaunchSupported" in image.message, image.message
