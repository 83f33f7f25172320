"""The checks run after an Azure connection is saved. Each is a named result with a fix hint.

Saving creates nothing billable: every call here is a read (a token, a VM list page, the
image, subnet and VNet, Resource SKUs, usages, public retail prices). Authentication comes
first; when it fails nothing else is asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.errors import AuthError, ProviderError
from shared.models import Check, CheckStatus
from shared.providers.azure import catalog
from shared.providers.azure.catalog import AvailableSize
from shared.providers.azure.client import AzureClient, as_dict, dig, region_code
from shared.providers.azure.config import AzureConfig

QUOTA_NOTE = "Quota approval does not reserve GPU capacity."
# Microsoft Entra ID's refusal codes -> what to fix.
SIGN_IN_HINTS = {
    "AADSTS7000215": "The client secret is wrong: paste the secret's Value (not its Secret ID).",
    "AADSTS7000222": "The client secret has expired: create a new one and replace the connection.",
    "AADSTS700016": "No application with this client ID in the tenant: copy the Application (client) ID again.",
    "AADSTS90002": "Tenant not found: copy the Directory (tenant) ID again (public Azure only).",
}


# A gallery image definition's SecurityType feature (Azure: "Trusted Launch for Azure VMs", image
# definitions): without one, or with a *Supported value, the image boots as Standard; TrustedLaunch allows
# Trusted Launch VMs only (a Standard create is refused with 400); ConfidentialVM needs a confidential size,
# and no supported GPU size is one.
TRUSTED_LAUNCH_ONLY = "trustedlaunch"
CONFIDENTIAL_ONLY = "confidentialvm"


def image_security_type(definition: dict[str, Any]) -> str:
    """The definition's SecurityType feature, lower-cased ("" when it has none)."""
    for feature in dig(definition, "properties", "features", default=[]) or []:
        if str(feature.get("name", "")).lower() == "securitytype":
            return str(feature.get("value", "")).lower()
    return ""


CONFIDENTIAL_FIX = ("the gallery image definition's SecurityType is ConfidentialVM, which needs a confidential VM "
                    "size, and no supported GPU size is one: publish the image version in a definition with "
                    "SecurityType TrustedLaunchSupported, TrustedLaunch or none, and save the connection with "
                    "that version's ID")


def run_checks(client: AzureClient, config: AzureConfig, public_url: str = "") -> list[Check]:
    """Read-only checks with fix hints, in order: authentication, image, subnet, gpu_sizes, prices, quota.
    public_url is the control plane's URL (TENSORANT_PUBLIC_URL): the VMs must reach it for heartbeats."""
    return _Checks(client, config, public_url).run()


def egress_text(public_url: str) -> str:
    """The outbound destinations a training VM needs (the same list as infra/azure/README.md)."""
    plane = f"the Tensorant control plane at {public_url}" if public_url else "the Tensorant control plane URL"
    return (f"{plane} (heartbeats: without it every run stops at its provisioning deadline), container "
            "registries, model downloads and your S3 service, plus DNS")


class _Checks:
    def __init__(self, client: AzureClient, config: AzureConfig, public_url: str = "") -> None:
        self.client = client
        self.config = config
        self.egress = egress_text(public_url)
        self.rg = config.resource_group
        self.region = config.region

    def run(self) -> list[Check]:
        checks = [self.check_auth()]
        if checks[0].status == CheckStatus.fail:
            return checks
        checks.append(self.guarded(self.check_image, "image"))
        checks.append(self.guarded(self.check_subnet, "subnet"))
        available: dict[str, AvailableSize] = {}

        def sizes() -> Check:
            nonlocal available
            available, unavailable = catalog.available_sizes(self.client, self.region)
            return self.check_sizes(available, unavailable)

        checks.append(self.guarded(sizes, "gpu_sizes"))
        checks.append(self.guarded(lambda: self.check_prices(available), "prices"))
        checks.append(self.guarded(lambda: self.check_quota(available), "quota"))
        return checks

    @staticmethod
    def guarded(fn: Callable[[], Check], name: str) -> Check:
        try:
            return fn()
        except ProviderError as e:
            return Check(name=name, status=CheckStatus.fail, message=e.reason)

    def check_auth(self) -> Check:
        refused = self.client.sign_in_error()
        if refused is not None:
            hint = next((h for code, h in SIGN_IN_HINTS.items() if code in refused),
                        "Check the tenant ID, client ID and the secret's Value.")
            return Check(name="authentication", status=CheckStatus.fail,
                         message=f"Microsoft Entra ID refused the service principal. {hint}")
        try:
            self.client.call("listing VMs in the training resource group",
                             lambda: next(iter(self.client.compute().virtual_machines.list(self.rg)), None))
        except ProviderError as e:
            if e.code in ("ResourceGroupNotFound",):
                msg = (f"Resource group {self.rg} does not exist in subscription {self.config.subscription_id}: "
                       "create the dedicated training resource group.")
            elif e.code in ("AuthorizationFailed",) or "rejected" in e.reason:
                msg = ("Signed in, but the service principal may not read VMs in the training resource group: assign "
                       f"the Tensorant Training Resources role at resource group {self.rg} and allow a few minutes "
                       "for role assignments to propagate.")
            else:
                msg = e.reason
            return Check(name="authentication", status=CheckStatus.fail, message=msg)
        return Check(name="authentication", status=CheckStatus.ok,
                     message=f"Signed in and can read resource group {self.rg}.")

    def check_image(self) -> Check:
        problems: list[str] = []
        trusted = ""
        gallery = self.config.gallery_parts
        reader_hint = ("assign the Tensorant Image Reader role at the image (or its gallery / resource group) "
                       "and wait for the assignment to propagate")
        if gallery:
            client = self.client.compute(gallery["sub"])
            try:
                definition = self.client.get("reading the gallery image definition", client.gallery_images.get,
                                             gallery["rg"], gallery["gallery"], gallery["image"])
                version = self.client.get("reading the gallery image version", client.gallery_image_versions.get,
                                          gallery["rg"], gallery["gallery"], gallery["image"], gallery["version"])
            except ProviderError as e:
                if gallery["sub"].lower() != self.config.subscription_id and (
                        isinstance(e, AuthError) or e.code in ("SubscriptionNotFound", "InvalidSubscriptionId")):
                    return Check(name="image", status=CheckStatus.fail, message=self.foreign_gallery(gallery, e))
                return Check(name="image", status=CheckStatus.fail, message=f"{e.reason} Fix: {reader_hint}.")
            if definition is None or version is None:
                return Check(name="image", status=CheckStatus.fail,
                             message="The gallery image version was not found: check the ID, or "
                                     f"{reader_hint} (both definition and version reads are needed).")
            props = definition.get("properties") or {}
            os_type, os_state = props.get("osType"), props.get("osState")
            generation, arch = props.get("hyperVGeneration"), props.get("architecture") or "x64"
            targets = {region_code(str(t.get("name", "")))
                       for t in dig(version, "properties", "publishingProfile", "targetRegions", default=[]) or []}
            if self.region not in targets:
                problems.append(f"version {gallery['version']} is not replicated to {self.region}: add it as a "
                                "target region of the version and wait for replication")
            image_gb = dig(version, "properties", "storageProfile", "osDiskImage", "sizeInGB")
            if dig(version, "properties", "storageProfile", "dataDiskImages"):
                problems.append("the image version has data disks; publish one with only an OS disk")
            if dig(version, "properties", "provisioningState", default="Succeeded") != "Succeeded":
                problems.append("the image version has not finished publishing")
            security = image_security_type(definition)
            if security == CONFIDENTIAL_ONLY:
                problems.append(CONFIDENTIAL_FIX)
            elif security == TRUSTED_LAUNCH_ONLY:
                trusted = (" Its definition allows Trusted Launch only: VMs are created with securityType "
                           "TrustedLaunch (vTPM on, Secure Boot off so the NVIDIA driver's kernel modules load).")
        else:
            managed = self.config.managed_image_parts
            assert managed
            try:
                image = self.client.get("reading the managed image", self.client.compute().images.get,
                                        managed["rg"], managed["name"])
            except ProviderError as e:
                return Check(name="image", status=CheckStatus.fail, message=f"{e.reason} Fix: {reader_hint}.")
            if image is None:
                return Check(name="image", status=CheckStatus.fail,
                             message=f"The managed image was not found: check the ID, or {reader_hint}.")
            props = image.get("properties") or {}
            os_disk = dig(props, "storageProfile", "osDisk", default={}) or {}
            os_type, os_state = os_disk.get("osType"), os_disk.get("osState")
            generation, arch = props.get("hyperVGeneration"), "x64"  # managed images are x64 only
            if region_code(str(image.get("location", ""))) != self.region:
                problems.append(f"a managed image can only create VMs in its own region ({image.get('location')}); "
                                f"create the image in {self.region} or publish a gallery version replicated there")
            image_gb = os_disk.get("diskSizeGB")
            if dig(props, "storageProfile", "dataDisks"):
                problems.append("the image has data disks; capture one with only an OS disk")
        if image_gb and int(image_gb) > self.config.os_disk_gb:
            problems.append(f"the image's OS disk is {image_gb} GiB, larger than the connection's OS disk size "
                            f"({self.config.os_disk_gb} GiB): raise os_disk_gb to at least {image_gb}")
        if str(os_type).lower() != "linux":
            problems.append(f"the image's OS type is {os_type}, not Linux")
        if str(generation).upper() != "V2":
            problems.append(f"the image is Hyper-V generation {generation or 'V1'}; capture a Gen2 (V2) image")
        if str(arch).lower() != "x64":
            problems.append(f"the image architecture is {arch}; ARM images are not supported, use x64")
        if os_state and str(os_state).lower() != "generalized":
            problems.append("the image is specialized; generalize the builder VM (waagent -deprovision+user) "
                            "and capture again")
        if problems:
            return Check(name="image", status=CheckStatus.fail,
                         message="Image not usable: " + "; ".join(problems) + ".")
        return Check(name="image", status=CheckStatus.ok, message="The image exists and is a Linux x64 Gen2 image"
                     + (f" replicated to {self.region}." if gallery else f" in {self.region}.") + trusted)

    def foreign_gallery(self, gallery: dict[str, str], error: ProviderError) -> str:
        """What to do when a gallery in another subscription cannot be read: the Tensorant roles are custom
        roles whose AssignableScopes name only the training subscription, so they cannot be assigned there."""
        gallery_id = (f"/subscriptions/{gallery['sub']}/resourceGroups/{gallery['rg']}/providers/Microsoft.Compute/"
                      f"galleries/{gallery['gallery']}")
        return (f"The image is in a Compute Gallery in subscription {gallery['sub']}, not in the training "
                f"subscription {self.config.subscription_id}, and the service principal cannot read it there "
                f"({error.code or 'refused'}). The Tensorant roles can only be assigned in the training subscription "
                "(their AssignableScopes), so assigning them does not reach this gallery. Fix, either: (1) in "
                f"subscription {gallery['sub']}, have its owner assign the built-in Reader role (or the Tensorant "
                f"Image Reader role after adding /subscriptions/{gallery['sub']} to its AssignableScopes) to this "
                f"application's service principal at the gallery {gallery_id}, then wait for the assignment to "
                "propagate (the VM create reads the image version there too); or (2) copy the image version into a "
                f"Compute Gallery in subscription {self.config.subscription_id} (az sig image-version create with "
                "--image-version-id set to this version's ID) and use the new version's ID.")

    def check_subnet(self) -> Check:
        parts = self.config.subnet_parts
        network = self.client.network()
        net_hint = ("assign the Tensorant Network role at the VNet (or its resource group) and wait for it "
                    "to propagate")
        try:
            subnet = self.client.get("reading the subnet", network.subnets.get, parts["rg"], parts["vnet"],
                                     parts["subnet"])
        except ProviderError as e:
            return Check(name="subnet", status=CheckStatus.fail, message=f"{e.reason} Fix: {net_hint}.")
        if subnet is None:
            return Check(name="subnet", status=CheckStatus.fail,
                         message=f"The subnet was not found: check the subnet resource ID, or {net_hint}.")
        try:
            vnet = self.client.get("reading the VNet", network.virtual_networks.get, parts["rg"], parts["vnet"])
        except ProviderError as e:
            return Check(name="subnet", status=CheckStatus.fail,
                         message=f"The subnet exists but its VNet's region could not be read ({e.reason}). "
                                 f"Fix: {net_hint}.")
        location = region_code(str((vnet or {}).get("location", "")))
        if location != self.region:
            return Check(name="subnet", status=CheckStatus.fail,
                         message=f"The subnet's VNet is in {location or 'an unknown region'}, not {self.region}: a "
                                 "VM's network interface must use a subnet in the VM's region. Choose a subnet in "
                                 f"{self.region} or change the region.")
        if not dig(subnet, "properties", "natGateway"):
            return Check(name="subnet", status=CheckStatus.warn,
                         message=f"The subnet exists in {self.region} but has no NAT gateway: make sure it has "
                                 "explicit outbound internet access (DNS and HTTPS) through a firewall route, or "
                                 f"associate a NAT gateway. Outbound HTTPS must reach {self.egress}.")
        return Check(name="subnet", status=CheckStatus.ok,
                     message=f"The subnet exists in {self.region} and has a NAT gateway for outbound access; its "
                             f"NSG and routes must let HTTPS reach {self.egress}.")

    def check_sizes(self, available: dict[str, AvailableSize], unavailable: dict[str, str]) -> Check:
        if not available:
            why = "; ".join(f"{k}: {v}" for k, v in unavailable.items()) or "none offered in this region"
            return Check(name="gpu_sizes", status=CheckStatus.fail,
                         message=f"No supported GPU size is available to this subscription in {self.region} "
                                 f"({why}). Choose another region, or ask Azure support to enable a size.")
        names = ", ".join(s.name for s in available.values())
        gone = "; ".join(f"{k}: {v}" for k, v in unavailable.items())
        extra = f" Not available: {gone}." if unavailable else ""
        return Check(name="gpu_sizes", status=CheckStatus.ok, message=f"Available in {self.region}: {names}.{extra}")

    def check_prices(self, available: dict[str, AvailableSize]) -> Check:
        if not available:
            return Check(name="prices", status=CheckStatus.warn, message="No available GPU size to price.")
        prices = self.client.prices()
        hourly = prices.vm_hourly(self.region, [s.name for s in available.values()])
        disk = prices.os_disk(self.region, self.config.os_disk_gb)
        missing = [s.name for k, s in available.items() if k not in hourly]
        if len(missing) == len(available):
            return Check(name="prices", status=CheckStatus.fail,
                         message=f"No on-demand Linux price found for the available sizes in {self.region}; the "
                                 "catalog will be empty. Try again later or choose another region.")
        msg = (f"Prices loaded for {len(hourly)} size(s); OS disk Premium SSD {disk.tier} "
               f"${disk.per_month:.2f}/month.")
        if missing:
            msg += f" No price for: {', '.join(missing)} (left out of the catalog)."
        return Check(name="prices", status=CheckStatus.ok, message=msg)

    def check_quota(self, available: dict[str, AvailableSize]) -> Check:
        if not available:
            return Check(name="quota", status=CheckStatus.warn,
                         message=f"No available GPU size to compare. {QUOTA_NOTE}")
        usages: list[dict[str, Any]] = self.client.call(
            "reading compute quota", lambda: [as_dict(u) for u in self.client.compute().usage.list(self.region)])
        free: dict[str, tuple[int, int]] = {}
        for u in usages:
            key = str(dig(u, "name", "value", default="")).lower()
            limit, current = int(u.get("limit", 0)), int(u.get("currentValue", 0))
            free[key] = (limit - current, limit)
        short: list[str] = []
        enough: list[str] = []
        total_free, _total_limit = free.get("cores", (0, 0))
        for s in available.values():
            family_free, family_limit = free.get(s.family.lower(), (0, 0))
            if family_free < s.vcpus:
                short.append(f"{s.name} needs {s.vcpus} vCPUs of {s.family} (limit {family_limit}, "
                             f"free {max(family_free, 0)})")
            elif total_free < s.vcpus:
                short.append(f"{s.name} needs {s.vcpus} Total Regional vCPUs (free {max(total_free, 0)})")
            else:
                enough.append(s.name)
        if short:
            return Check(name="quota", status=CheckStatus.warn,
                         message="Quota shortfall: " + "; ".join(short) + ". Request more in Subscriptions -> "
                                 "Usage + quotas (VM family and Total Regional vCPUs) for "
                                 f"{self.region}. {QUOTA_NOTE}")
        return Check(name="quota", status=CheckStatus.ok,
                     message=f"Quota covers one VM of: {', '.join(enough)}. {QUOTA_NOTE}")
