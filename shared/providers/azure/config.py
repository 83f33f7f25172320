"""What an owner saves for an Azure compute connection, validated the moment it is saved.

Every rejection says what to paste instead: the connection doc lists the formats people
get wrong (display names for regions, subnet names, Marketplace URNs, gallery image
definitions, the secret's ID instead of its value, keys of the wrong kind). Nothing here
imports an Azure SDK.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from shared.providers.azure.pricing import disk_tier

GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
RG_NAME = re.compile(r"^[-\w._()]{1,90}$")
SUBNET_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Network/"
    r"virtualNetworks/(?P<vnet>[^/]+)/subnets/(?P<subnet>[^/]+)$",
    re.I,
)
MANAGED_IMAGE_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/images/(?P<name>[^/]+)$",
    re.I,
)
GALLERY_VERSION_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/galleries/"
    r"(?P<gallery>[^/]+)/images/(?P<image>[^/]+)/versions/(?P<version>[^/]+)$",
    re.I,
)
EXPLICIT_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
# Sovereign clouds use other management and identity endpoints; this connector speaks public Azure only.
SOVEREIGN_REGION = re.compile(r"^(usgov|usdod|ussec|usnat|china|germanycentral$|germanynortheast$)")
SOVEREIGN_TENANT_DOMAIN = re.compile(r"\.(onmicrosoft\.us|partner\.onmschina\.cn|onmicrosoft\.de)$", re.I)

# Regions where at least one of the sizes in catalog.SUPPORTED is commonly offered (a hint only; the
# connection check asks Azure which sizes this subscription can really use).
KNOWN_GPU_REGIONS = frozenset({
    "eastus", "eastus2", "southcentralus", "westus2", "westus3", "centralus", "northcentralus", "westus",
    "westeurope", "northeurope", "uksouth", "swedencentral", "francecentral", "germanywestcentral",
    "switzerlandnorth", "norwayeast", "polandcentral", "italynorth", "spaincentral", "canadacentral",
    "canadaeast", "japaneast", "koreacentral", "southeastasia", "eastasia", "australiaeast", "centralindia",
    "southindia", "uaenorth", "qatarcentral", "brazilsouth", "southafricanorth",
})

SUBNET_HINT = (
    "paste the subnet's complete resource ID, e.g. /subscriptions/SUBSCRIPTION_ID/resourceGroups/NETWORK_RG/"
    "providers/Microsoft.Network/virtualNetworks/VNET/subnets/SUBNET (az network vnet subnet show ... --query id)"
)
IMAGE_HINT = (
    "paste a managed image ID (/subscriptions/.../providers/Microsoft.Compute/images/NAME, from az image show "
    "--query id) or a Compute Gallery image-version ID ending in /versions/1.0.0 or another explicit version"
)


def parse_ssh_public_key(text: str) -> tuple[str, int]:
    """(key type, bits) of an OpenSSH public key line; raises ValueError with what to paste instead."""
    text = text.strip()
    if "PRIVATE KEY" in text:
        raise ValueError("this is a private key; keep it secret and paste the contents of the .pub file instead")
    parts = text.split()
    if len(parts) < 2:
        raise ValueError("paste the whole line of the .pub file: 'ssh-ed25519 AAAA... comment'")
    kind, blob_b64 = parts[0], parts[1]
    if kind not in ("ssh-ed25519", "ssh-rsa"):
        raise ValueError(f"{kind!r} keys are not accepted; create an Ed25519 key (ssh-keygen -t ed25519) "
                         "or an RSA key of at least 2048 bits")
    try:
        blob = base64.b64decode(blob_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the key's base64 part is damaged; copy the .pub file's line again") from None
    fields = []
    pos = 0
    try:
        while pos < len(blob):
            (length,) = struct.unpack(">I", blob[pos:pos + 4])
            fields.append(blob[pos + 4:pos + 4 + length])
            if len(fields[-1]) != length:
                raise ValueError("short field")
            pos += 4 + length
    except (struct.error, ValueError):
        raise ValueError("the key's base64 part is damaged; copy the .pub file's line again") from None
    if not fields or fields[0].decode(errors="replace") != kind:
        raise ValueError("the key's type and its contents disagree; copy the .pub file's line again")
    if kind == "ssh-ed25519":
        if len(fields) != 2 or len(fields[1]) != 32:
            raise ValueError("the Ed25519 key is damaged; copy the .pub file's line again")
        return kind, 256
    if len(fields) != 3:
        raise ValueError("the RSA key is damaged; copy the .pub file's line again")
    bits = int.from_bytes(fields[2], "big").bit_length()
    if bits < 2048:
        raise ValueError(f"this RSA key has {bits} bits; Azure needs at least 2048 (ssh-keygen -t ed25519 is simplest)")
    return kind, bits


class AzureConfig(BaseModel):
    """An Azure compute connection (public cloud only): service principal, placement, image, key, disk size."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    tenant_id: str = Field(description="Directory (tenant) ID")
    client_id: str = Field(description="Application (client) ID")
    client_secret: SecretStr = Field(description="The client secret's Value (not its Secret ID)")
    subscription_id: str = Field(description="The subscription's ID (a GUID)")
    resource_group: str = Field(description="The dedicated training resource group")
    region: str = Field(description="Location code such as eastus")
    subnet_id: str = Field(description="The subnet's complete resource ID")
    image_id: str = Field(description="Managed image ID or gallery image-version ID")
    ssh_public_key: str = Field(description="Contents of the .pub file (Ed25519, or RSA >= 2048 bits)")
    os_disk_gb: int = Field(default=128, ge=30, le=4095, description="Premium SSD OS disk size in GiB")

    @field_validator("tenant_id")
    @classmethod
    def _tenant(cls, v: str) -> str:
        if SOVEREIGN_TENANT_DOMAIN.search(v):
            raise ValueError("sovereign-cloud tenants are not supported; use a public Azure tenant")
        if not GUID.match(v):
            raise ValueError("paste the Directory (tenant) ID from the app registration's overview, "
                             "a GUID like 00000000-0000-0000-0000-000000000000")
        return v.lower()

    @field_validator("client_id", "subscription_id")
    @classmethod
    def _guid(cls, v: str, info: ValidationInfo) -> str:
        if not GUID.match(v):
            what = ("the Application (client) ID from the app registration's overview"
                    if info.field_name == "client_id"
                    else "the subscription ID from the subscription's overview")
            raise ValueError(f"paste {what}, a GUID like 00000000-0000-0000-0000-000000000000")
        return v.lower()

    @field_validator("client_secret")
    @classmethod
    def _secret(cls, v: SecretStr) -> SecretStr:
        value = v.get_secret_value().strip()
        if not value:
            raise ValueError("paste the client secret's Value")
        if GUID.match(value):
            # A secret's Value is ~40 characters with '~' in it; its Secret ID is a GUID.
            raise ValueError("this looks like the secret's Secret ID (a GUID); paste its Value instead, shown "
                             "only when the secret is created (create a new secret if you no longer have it)")
        return SecretStr(value)

    @field_validator("resource_group")
    @classmethod
    def _rg(cls, v: str) -> str:
        if v.startswith("/subscriptions/"):
            raise ValueError("paste only the resource group's name, e.g. tensorant-training")
        if not RG_NAME.match(v) or v.endswith("."):
            raise ValueError("a resource group name has 1-90 letters, digits, '-', '_', '.', '(' or ')'")
        return v

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        code = v.lower().replace(" ", "")
        if code != v:
            raise ValueError(f"use the location code, not the display name: {code!r} instead of {v!r}")
        if SOVEREIGN_REGION.match(code):
            raise ValueError("sovereign-cloud regions are not supported; choose a public Azure region such as eastus")
        if not re.fullmatch(r"[a-z][a-z0-9]{2,30}", code):
            raise ValueError("use a location code such as eastus (az account list-locations --query [].name)")
        return code

    @field_validator("subnet_id")
    @classmethod
    def _subnet(cls, v: str) -> str:
        if not SUBNET_ID.match(v):
            if "/" not in v:
                raise ValueError(f"{v!r} looks like a subnet name; {SUBNET_HINT}")
            raise ValueError(SUBNET_HINT)
        return v

    @field_validator("image_id")
    @classmethod
    def _image(cls, v: str) -> str:
        low = v.lower()
        if low == "latest" or low.endswith("/versions/latest"):
            raise ValueError(f"'latest' is not accepted, so every run uses the image you tested; {IMAGE_HINT}")
        if not v.startswith("/") and v.count(":") == 3:
            raise ValueError(f"a Marketplace URN (Publisher:Offer:Sku:Version) is not accepted; {IMAGE_HINT}")
        if "/providers/microsoft.compute/virtualmachines/" in low:
            raise ValueError(f"this is a VM ID; capture the VM as an image first, then {IMAGE_HINT}")
        if "/providers/microsoft.compute/disks/" in low or "/providers/microsoft.compute/snapshots/" in low:
            raise ValueError(f"this is a disk or snapshot ID; {IMAGE_HINT}")
        if "communitygalleries/" in low or "sharedgalleries/" in low:
            raise ValueError(f"community and directly shared gallery IDs are not accepted; {IMAGE_HINT}")
        if MANAGED_IMAGE_ID.match(v):
            return v
        m = GALLERY_VERSION_ID.match(v)
        if m:
            if not EXPLICIT_VERSION.match(m["version"]):
                raise ValueError(f"use an explicit version such as 1.0.0, not {m['version']!r}; {IMAGE_HINT}")
            return v
        if re.search(r"/galleries/[^/]+/images/[^/]+/?$", v, re.I):
            raise ValueError("this is a gallery image definition without a version; append /versions/1.0.0 "
                             "(or the explicit version you replicated to the training region)")
        raise ValueError(IMAGE_HINT)

    @field_validator("ssh_public_key")
    @classmethod
    def _ssh(cls, v: str) -> str:
        parse_ssh_public_key(v)
        return " ".join(v.split())

    @model_validator(mode="after")
    def _same_subscription(self) -> AzureConfig:
        m = SUBNET_ID.match(self.subnet_id)
        if m and m["sub"].lower() != self.subscription_id:
            raise ValueError("subnet_id: the subnet is in another subscription; a VM's network interface must use a "
                             f"subnet in subscription {self.subscription_id}: {SUBNET_HINT}")
        im = MANAGED_IMAGE_ID.match(self.image_id)
        if im and im["sub"].lower() != self.subscription_id:
            raise ValueError("image_id: a managed image can only be used in its own subscription; publish it to a "
                             "Compute Gallery and paste the image-version ID instead")
        return self

    # ------------------------------------------------------------ derived values

    @property
    def subnet_parts(self) -> dict[str, str]:
        m = SUBNET_ID.match(self.subnet_id)
        assert m
        return m.groupdict()

    @property
    def gallery_parts(self) -> dict[str, str] | None:
        m = GALLERY_VERSION_ID.match(self.image_id)
        return m.groupdict() if m else None

    @property
    def managed_image_parts(self) -> dict[str, str] | None:
        m = MANAGED_IMAGE_ID.match(self.image_id)
        return m.groupdict() if m else None

    def warnings(self) -> list[str]:
        """Non-fatal notes shown beside the saved connection."""
        out = ["Tensorant cannot read the client secret's expiry (it needs no directory access): "
               "rotate it before it expires, replacing the connection with the new value."]
        if self.region not in KNOWN_GPU_REGIONS:
            out.append(f"{self.region} is not a region where the supported GPU sizes are commonly offered; "
                       "the connection check lists which sizes your subscription can use there.")
        tier, size = disk_tier(self.os_disk_gb)
        if size != self.os_disk_gb:
            out.append(f"An OS disk of {self.os_disk_gb} GiB is billed as Premium SSD {tier} ({size} GiB); "
                       f"consider os_disk_gb={size}.")
        return out
