"""AzureConfig rejects each wrong paste at once, with a message that says what to paste instead."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from shared.providers.azure.config import AzureConfig
from tests.providers.azure.rig import GALLERY_IMAGE, GALLERY_VERSION_ID, SUB, config_body, rsa_pub

OTHER_SUB = "22222222-3333-4444-5555-666666666666"
ROLES = ("config", "client", "errors", "catalog", "pricing", "checks", "compute")


def rejected(**over: object) -> str:
    with pytest.raises(ValidationError) as info:
        AzureConfig(**config_body(**over))
    return str(info.value)


def test_valid_config_accepted_with_managed_image_and_gallery_version() -> None:
    cfg = AzureConfig(**config_body())
    assert cfg.region == "eastus" and cfg.os_disk_gb == 128
    assert cfg.client_secret.get_secret_value() not in repr(cfg)
    gallery = AzureConfig(**config_body(image_id=GALLERY_VERSION_ID))
    assert gallery.gallery_parts == {"sub": SUB, "rg": "images-rg", "gallery": "g1", "image": "tgpu",
                                     "version": "1.0.0"}
    # a gallery version may live in another subscription of the tenant
    AzureConfig(**config_body(image_id=GALLERY_VERSION_ID.replace(SUB, OTHER_SUB)))


def test_region_display_name_rejected_with_the_code_to_use() -> None:
    msg = rejected(region="East US")
    assert "'eastus' instead of 'East US'" in msg


@pytest.mark.parametrize("region", ["usgovvirginia", "chinaeast2", "germanycentral", "usdodeast"])
def test_sovereign_regions_rejected(region: str) -> None:
    assert "sovereign" in rejected(region=region)


def test_public_germany_region_is_not_mistaken_for_sovereign() -> None:
    assert AzureConfig(**config_body(region="germanywestcentral")).region == "germanywestcentral"


def test_sovereign_tenant_domain_rejected() -> None:
    assert "sovereign" in rejected(tenant_id="contoso.onmicrosoft.us")


def test_subnet_name_instead_of_resource_id_rejected() -> None:
    msg = rejected(subnet_id="training")
    assert "looks like a subnet name" in msg and "az network vnet subnet show" in msg


def test_subnet_in_another_subscription_rejected() -> None:
    other = f"/subscriptions/{OTHER_SUB}/resourceGroups/n/providers/Microsoft.Network/virtualNetworks/v/subnets/s"
    assert "another subscription" in rejected(subnet_id=other)


@pytest.mark.parametrize(
    ("image", "expect"),
    [
        ("Canonical:ubuntu-24_04-lts:server:latest", "Marketplace URN"),
        ("Canonical:ubuntu-24_04-lts:server:24.04.202411030", "Marketplace URN"),
        (f"/subscriptions/{SUB}/resourceGroups/r/providers/Microsoft.Compute/virtualMachines/builder", "VM ID"),
        (f"/subscriptions/{SUB}/resourceGroups/r/providers/Microsoft.Compute/disks/builder-os", "disk"),
        (GALLERY_IMAGE, "without a version"),
        (f"{GALLERY_IMAGE}/versions/latest", "'latest' is not accepted"),
        ("latest", "'latest' is not accepted"),
        (f"{GALLERY_IMAGE}/versions/1.0", "explicit version"),
        ("tensorant-gpu-v1", "managed image ID"),
    ],
)
def test_image_formats_rejected(image: str, expect: str) -> None:
    msg = rejected(image_id=image)
    assert expect in msg
    assert "/versions/1.0.0" in msg or "versions/1.0.0" in msg or "explicit version" in msg


def test_managed_image_in_another_subscription_rejected() -> None:
    other = f"/subscriptions/{OTHER_SUB}/resourceGroups/r/providers/Microsoft.Compute/images/x"
    assert "Compute Gallery" in rejected(image_id=other)


def test_ssh_keys() -> None:
    assert AzureConfig(**config_body(ssh_public_key=rsa_pub(2048))).ssh_public_key.startswith("ssh-rsa ")
    assert "1024 bits" in rejected(ssh_public_key=rsa_pub(1024))
    assert "private key" in rejected(ssh_public_key="-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH "
                                                    "PRIVATE KEY-----")
    assert "not accepted" in rejected(ssh_public_key="ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTY= x")
    assert "damaged" in rejected(ssh_public_key="ssh-ed25519 AAAA!!notbase64")
    # type label says ed25519 but the blob is an RSA key
    blob = rsa_pub(2048).split()[1]
    assert "disagree" in rejected(ssh_public_key=f"ssh-ed25519 {blob}")


def test_secret_id_pasted_instead_of_value_rejected() -> None:
    msg = rejected(client_secret="3f2504e0-4f89-11d3-9a0c-0305e82c3301")
    assert "Secret ID" in msg and "Value" in msg


def test_ids_must_be_guids() -> None:
    assert "Application (client) ID" in rejected(client_id="tensorant-training")
    assert "Directory (tenant) ID" in rejected(tenant_id="contoso")
    assert "subscription ID" in rejected(subscription_id="Pay-As-You-Go")


def test_resource_group_must_be_a_name() -> None:
    assert "only the resource group's name" in rejected(resource_group=f"/subscriptions/{SUB}/resourceGroups/x")


def test_unknown_fields_and_bad_disk_size_rejected() -> None:
    with pytest.raises(ValidationError):
        AzureConfig(**config_body(location="eastus"))
    with pytest.raises(ValidationError):
        AzureConfig(**config_body(os_disk_gb=10))


def test_warnings_are_non_fatal_notes() -> None:
    cfg = AzureConfig(**config_body(os_disk_gb=100, region="brazilsoutheast"))
    notes = cfg.warnings()
    assert any("rotate" in n for n in notes)
    assert any("P10 (128 GiB)" in n for n in notes)
    assert any("brazilsoutheast" in n for n in notes)
    assert len(AzureConfig(**config_body()).warnings()) == 1


def test_importing_the_provider_loads_no_azure_sdk() -> None:
    # every module of the provider: the SDKs (and requests, for prices) load only when a call needs them
    modules = ", ".join(f"shared.providers.azure.{m}" for m in ROLES)
    code = (f"import sys, {modules}; "
            "bad = [m for m in sys.modules if m.startswith(('azure.mgmt', 'azure.identity', 'azure.core', 'requests'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
