"""Azure compute: one private GPU VM per run, from the customer's image, in the customer's subnet.

How it meets the ComputeProvider contracts (shared/providers/base.py):
- Names are deterministic from RunRef.name: VM `<name>`, NIC `<name>-nic`, OS disk
  `<name>-osdisk`, all in the training resource group. launch looks for them first, so a
  repeated launch finds the same VM instead of creating a second one.
- Marks: the VM and NIC carry RunRef.tags at creation. Azure has no way to tag the
  implicit OS disk in the VM request (VM tags do not propagate), so the disk is tagged by
  a PATCH as soon as it exists (end of launch, or the next describe). Until then it is
  recognised by its deterministic name AND by being the OS disk of our tagged VM; it is
  also bound to that VM with deleteOption=Delete, so deleting the VM removes it.
- Long-running operations: begin_* then a bounded wait (AzureEndpoints.lro_wait_s). If
  Azure has not finished, retain/start/release return Outcome(done=False) and the step
  asks again later; launch returns the recorded resources and describe reports progress
  (and a VM whose provisioning failed is cleaned up by the next launch or by release).
- Failed creation: Azure can create the VM resource even when allocation fails, so a
  permanent failure deletes the VM, its OS disk and the NIC before raising. Whatever
  cannot be confirmed gone at once (a NIC reserved for the failed VM) is found again by
  release or the sweeper through its name and tags.
- Release refuses automatic deletion by raising PermanentError(code="AttachmentsChanged")
  when the VM's OS disk or NIC is not the job-created one or extra data disks are
  attached: the release step shows the reason on the run, nothing is retried in a loop,
  and "retry release" works once the attachments are restored.
- Throttling (429): up to MAX_THROTTLE_RETRIES inline retries when Retry-After is short,
  then ThrottledError(retry_after_s=Retry-After).
- Only the training resource group's VMs, disks and NICs with this deployment's marks are
  ever changed; the resource group, image, subnet, VNet, NSG and NAT gateway are only read.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.log import get_logger, register_secret
from shared.models import Check, CheckStatus, CloudResource, GpuOffer, MachineState
from shared.providers import cloudinit
from shared.providers.azure.config import AzureConfig
from shared.providers.azure.errors import error_code, retry_after, status_code, translate
from shared.providers.azure.prices import PRICE_NOTE, RETAIL_PRICES_URL, RetailPrices
from shared.providers.azure.skus import disk_tier, supported
from shared.providers.base import (
    TAG_DEPLOYMENT,
    TAG_MANAGED,
    TAG_ORG,
    TAG_RUN,
    Description,
    LaunchSpec,
    Outcome,
    RunRef,
)
from shared.providers.errors import PermanentError, ProviderError, RetryableError
from shared.settings import Settings

ARM_SCOPE = "https://management.azure.com/.default"
ADMIN_USER = "tensorant"
MAX_THROTTLE_RETRIES = 2
MAX_INLINE_RETRY_AFTER_S = 10.0
QUOTA_NOTE = "Quota approval does not reserve GPU capacity."


@dataclass(frozen=True)
class AzureEndpoints:
    """Where the clients talk to and how long they wait. Defaults = public Azure.

    Tests point everything at a fake ARM server on loopback: arm_url/authority/prices_url
    at https://127.0.0.1:PORT, verify = the self-signed certificate's path, retry_total=0,
    polling_interval=0 and a short lro_wait_s.
    """

    arm_url: str | None = None
    authority: str | None = None  # None = login.microsoftonline.com (public cloud only)
    prices_url: str = RETAIL_PRICES_URL
    verify: bool | str = True
    retry_total: int | None = 3  # connection errors; HTTP status retries are ours (see _call)
    polling_interval: float | None = None
    read_timeout_s: float = 60.0  # no call may hang a step
    lro_wait_s: float = 90.0
    credential: Any = None  # a TokenCredential to use instead of ClientSecretCredential
    sleep: Callable[[float], None] = time.sleep


# Tests only: registry-constructed instances (AzureCompute(config, settings)) use this when set.
TEST_ENDPOINTS: AzureEndpoints | None = None


def _dig(d: Any, *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def _same_id(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and str(a).rstrip("/").lower() == str(b).rstrip("/").lower()


def _region_code(name: str) -> str:
    return name.lower().replace(" ", "")


def _as_dict(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    out: dict[str, Any] = obj.as_dict()
    return out


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


class AzureCompute:
    name = "azure"

    def __init__(self, config: AzureConfig, settings: Settings, *, endpoints: AzureEndpoints | None = None) -> None:
        self.config = config
        self.settings = settings
        self.endpoints = endpoints or TEST_ENDPOINTS or AzureEndpoints()
        register_secret(config.client_secret.get_secret_value())
        self._cred: Any = None
        self._compute_clients: dict[str, Any] = {}
        self._network: Any = None
        self.rg = config.resource_group
        self.region = config.region

    # ------------------------------------------------------------ clients (SDKs imported lazily)

    def credential(self) -> Any:
        if self._cred is None:
            if self.endpoints.credential is not None:
                self._cred = self.endpoints.credential
            else:
                from azure.identity import ClientSecretCredential

                kw: dict[str, Any] = {}
                if self.endpoints.authority:
                    kw.update(authority=self.endpoints.authority, disable_instance_discovery=True)
                if self.endpoints.verify is not True:
                    kw["connection_verify"] = self.endpoints.verify
                if self.endpoints.retry_total is not None:
                    kw["retry_total"] = self.endpoints.retry_total
                self._cred = ClientSecretCredential(
                    self.config.tenant_id, self.config.client_id, self.config.client_secret.get_secret_value(), **kw)
        return self._cred

    def _client_kwargs(self) -> dict[str, Any]:
        # retry_status=0: the SDK would sleep out every Retry-After of a 429 (unbounded); _call retries
        # short ones and turns long ones into ThrottledError so the step waits with a delayed message.
        kw: dict[str, Any] = {"retry_status": 0, "connection_timeout": 20, "read_timeout": self.endpoints.read_timeout_s}
        if self.endpoints.arm_url:
            kw["base_url"] = self.endpoints.arm_url
            kw["credential_scopes"] = [ARM_SCOPE]
        if self.endpoints.verify is not True:
            kw["connection_verify"] = self.endpoints.verify
        if self.endpoints.retry_total is not None:
            kw["retry_total"] = self.endpoints.retry_total
        if self.endpoints.polling_interval is not None:
            kw["polling_interval"] = self.endpoints.polling_interval
        return kw

    def compute(self, subscription_id: str | None = None) -> Any:
        sub = (subscription_id or self.config.subscription_id).lower()
        if sub not in self._compute_clients:
            from azure.mgmt.compute import ComputeManagementClient

            self._compute_clients[sub] = ComputeManagementClient(self.credential(), sub, **self._client_kwargs())
        return self._compute_clients[sub]

    def network(self) -> Any:
        if self._network is None:
            from azure.mgmt.network import NetworkManagementClient

            self._network = NetworkManagementClient(self.credential(), self.config.subscription_id,
                                                    **self._client_kwargs())
        return self._network

    # ------------------------------------------------------------ call helpers

    def _call(self, doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One Azure call: short 429s retried inline (bounded), everything else translated."""
        from azure.core.exceptions import AzureError

        for attempt in range(MAX_THROTTLE_RETRIES + 1):
            try:
                return fn(*args, **kwargs)
            except AzureError as e:
                wait = retry_after(e, default=1.0)
                if status_code(e) == 429 and attempt < MAX_THROTTLE_RETRIES and wait <= MAX_INLINE_RETRY_AFTER_S:
                    self.endpoints.sleep(wait)
                    continue
                raise translate(e, doing) from None
        raise AssertionError("unreachable")

    def _get(self, doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """A GET where 404 means "not there" (None)."""
        from azure.core.exceptions import AzureError

        def get() -> Any:
            try:
                return fn(*args, **kwargs)
            except AzureError as e:
                if status_code(e) == 404:
                    return None
                raise

        found = self._call(doing, get)
        return _as_dict(found) if found is not None else None

    def _wait(self, doing: str, poller: Any) -> bool:
        """Wait for a long-running operation at most lro_wait_s. True = finished (raises if it failed)."""
        from azure.core.exceptions import AzureError

        try:
            poller.wait(timeout=self.endpoints.lro_wait_s)  # re-raises the operation's failure
            if not poller.done():
                return False
            poller.result()
        except AzureError as e:
            raise translate(e, doing) from None
        return True

    # ------------------------------------------------------------ names and marks

    def _rid(self, provider_type: str, name: str) -> str:
        return (f"/subscriptions/{self.config.subscription_id}/resourceGroups/{self.rg}/providers/"
                f"{provider_type}/{name}")

    @staticmethod
    def names(ref: RunRef) -> tuple[str, str, str]:
        return ref.name, f"{ref.name}-nic", f"{ref.name}-osdisk"

    def _ours(self, tags: dict[str, str] | None, ref: RunRef | None = None) -> bool:
        tags = tags or {}
        if tags.get(TAG_MANAGED) != "true" or tags.get(TAG_DEPLOYMENT) != self.settings.deployment_id:
            return False
        return ref is None or tags.get(TAG_RUN) == ref.run_id

    def _resource(self, kind: str, body: dict[str, Any], state: str = "") -> CloudResource:
        tags = body.get("tags") or {}
        props = body.get("properties") or {}
        return CloudResource(
            provider=self.name, kind=kind, id=str(body.get("id", "")), name=str(body.get("name", "")),
            region=_region_code(str(body.get("location", self.region))), run_id=tags.get(TAG_RUN, ""),
            org=tags.get(TAG_ORG, ""), deployment=tags.get(TAG_DEPLOYMENT, ""),
            managed=tags.get(TAG_MANAGED) == "true", created_at=_parse_time(props.get("timeCreated")),
            state=state or str(props.get("provisioningState", "")),
        )

    def _expected(self, ref: RunRef) -> list[CloudResource]:
        vm, nic, disk = self.names(ref)
        common = dict(provider=self.name, region=self.region, run_id=ref.run_id, org=ref.org,
                      deployment=ref.deployment)
        return [
            CloudResource(kind="vm", id=self._rid("Microsoft.Compute/virtualMachines", vm), name=vm, **common),
            CloudResource(kind="disk", id=self._rid("Microsoft.Compute/disks", disk), name=disk, **common),
            CloudResource(kind="nic", id=self._rid("Microsoft.Network/networkInterfaces", nic), name=nic, **common),
        ]

    # ------------------------------------------------------------ reads

    def _get_vm(self, name: str, *, instance_view: bool = False) -> dict[str, Any] | None:
        kw = {"expand": "instanceView"} if instance_view else {}
        return self._get(f"reading VM {name}", self.compute().virtual_machines.get, self.rg, name, **kw)

    def _get_disk(self, name: str) -> dict[str, Any] | None:
        return self._get(f"reading disk {name}", self.compute().disks.get, self.rg, name)

    def _get_nic(self, name: str) -> dict[str, Any] | None:
        return self._get(f"reading network interface {name}", self.network().network_interfaces.get, self.rg, name)

    @staticmethod
    def _statuses(vm: dict[str, Any]) -> list[str]:
        return [str(s.get("code", "")) for s in _dig(vm, "properties", "instanceView", "statuses", default=[]) or []]

    @classmethod
    def _power(cls, vm: dict[str, Any]) -> str:
        for code in cls._statuses(vm):
            if code.startswith("PowerState/"):
                return code.split("/", 1)[1]
        return ""

    @classmethod
    def _failure(cls, vm: dict[str, Any]) -> tuple[str, str]:
        """(code, message) of a VM whose provisioning failed, from its instance view."""
        for s in _dig(vm, "properties", "instanceView", "statuses", default=[]) or []:
            code = str(s.get("code", ""))
            if code.startswith("ProvisioningState/failed"):
                return code.split("/")[-1], str(s.get("message", ""))
        return "ProvisioningFailed", "the VM's provisioning failed"

    # ------------------------------------------------------------ validate

    def validate(self) -> list[Check]:
        """Read-only checks with fix hints; creates nothing billable."""
        checks = [self._check_auth()]
        if checks[0].status == CheckStatus.fail:
            return checks
        for fn in (self._check_image, self._check_subnet):
            checks.append(self._guarded(fn))
        available: dict[str, dict[str, Any]] = {}

        def sizes() -> Check:
            nonlocal available
            available, unavailable = self._available_sizes()
            if not available:
                why = "; ".join(f"{k}: {v}" for k, v in unavailable.items()) or "none offered in this region"
                return Check(name="gpu_sizes", status=CheckStatus.fail,
                             message=f"No supported GPU size is available to this subscription in {self.region} "
                                     f"({why}). Choose another region, or ask Azure support to enable a size.")
            names = ", ".join(s["name"] for s in available.values())
            gone = "; ".join(f"{k}: {v}" for k, v in unavailable.items())
            extra = f" Not available: {gone}." if unavailable else ""
            return Check(name="gpu_sizes", status=CheckStatus.ok,
                         message=f"Available in {self.region}: {names}.{extra}")

        checks.append(self._guarded(sizes, name="gpu_sizes"))
        checks.append(self._guarded(lambda: self._check_prices(available), name="prices"))
        checks.append(self._guarded(lambda: self._check_quota(available), name="quota"))
        return checks

    def _guarded(self, fn: Callable[[], Check], name: str = "") -> Check:
        try:
            return fn()
        except ProviderError as e:
            check_name = name or fn.__name__.removeprefix("_check_")
            return Check(name=check_name, status=CheckStatus.fail, message=e.reason)

    def _check_auth(self) -> Check:
        from azure.core.exceptions import ClientAuthenticationError

        try:
            self.credential().get_token(ARM_SCOPE)
        except ClientAuthenticationError as e:
            text = str(e)
            hint = "Check the tenant ID, client ID and the secret's Value."
            if "AADSTS7000215" in text:
                hint = "The client secret is wrong: paste the secret's Value (not its Secret ID)."
            elif "AADSTS7000222" in text:
                hint = "The client secret has expired: create a new one and replace the connection."
            elif "AADSTS700016" in text:
                hint = "No application with this client ID in the tenant: copy the Application (client) ID again."
            elif "AADSTS90002" in text:
                hint = "Tenant not found: copy the Directory (tenant) ID again (public Azure only)."
            return Check(name="authentication", status=CheckStatus.fail,
                         message=f"Microsoft Entra ID refused the service principal. {hint}")
        try:
            self._call("listing VMs in the training resource group",
                       lambda: next(iter(self.compute().virtual_machines.list(self.rg)), None))
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

    def _check_image(self) -> Check:
        problems: list[str] = []
        gallery = self.config.gallery_parts
        reader_hint = ("assign the Tensorant Image Reader role at the image (or its gallery / resource group) "
                       "and wait for the assignment to propagate")
        if gallery:
            client = self.compute(gallery["sub"])
            try:
                definition = self._get("reading the gallery image definition", client.gallery_images.get,
                                       gallery["rg"], gallery["gallery"], gallery["image"])
                version = self._get("reading the gallery image version", client.gallery_image_versions.get,
                                    gallery["rg"], gallery["gallery"], gallery["image"], gallery["version"])
            except ProviderError as e:
                return Check(name="image", status=CheckStatus.fail, message=f"{e.reason} Fix: {reader_hint}.")
            if definition is None or version is None:
                return Check(name="image", status=CheckStatus.fail,
                             message="The gallery image version was not found: check the ID, or "
                                     f"{reader_hint} (both definition and version reads are needed).")
            props = definition.get("properties") or {}
            os_type, os_state = props.get("osType"), props.get("osState")
            generation, arch = props.get("hyperVGeneration"), props.get("architecture") or "x64"
            targets = {_region_code(str(t.get("name", "")))
                       for t in _dig(version, "properties", "publishingProfile", "targetRegions", default=[]) or []}
            if self.region not in targets:
                problems.append(f"version {gallery['version']} is not replicated to {self.region}: add it as a "
                                "target region of the version and wait for replication")
            image_gb = _dig(version, "properties", "storageProfile", "osDiskImage", "sizeInGB")
            if _dig(version, "properties", "storageProfile", "dataDiskImages"):
                problems.append("the image version has data disks; publish one with only an OS disk")
            if _dig(version, "properties", "provisioningState", default="Succeeded") != "Succeeded":
                problems.append("the image version has not finished publishing")
        else:
            managed = self.config.managed_image_parts
            assert managed
            try:
                image = self._get("reading the managed image", self.compute().images.get, managed["rg"],
                                  managed["name"])
            except ProviderError as e:
                return Check(name="image", status=CheckStatus.fail, message=f"{e.reason} Fix: {reader_hint}.")
            if image is None:
                return Check(name="image", status=CheckStatus.fail,
                             message=f"The managed image was not found: check the ID, or {reader_hint}.")
            props = image.get("properties") or {}
            os_disk = _dig(props, "storageProfile", "osDisk", default={}) or {}
            os_type, os_state = os_disk.get("osType"), os_disk.get("osState")
            generation, arch = props.get("hyperVGeneration"), "x64"  # managed images are x64 only
            if _region_code(str(image.get("location", ""))) != self.region:
                problems.append(f"a managed image can only create VMs in its own region ({image.get('location')}); "
                                f"create the image in {self.region} or publish a gallery version replicated there")
            image_gb = os_disk.get("diskSizeGB")
            if _dig(props, "storageProfile", "dataDisks"):
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
                     + (f" replicated to {self.region}." if gallery else f" in {self.region}."))

    def _check_subnet(self) -> Check:
        parts = self.config.subnet_parts
        net_hint = ("assign the Tensorant Network role at the VNet (or its resource group) and wait for it "
                    "to propagate")
        try:
            subnet = self._get("reading the subnet", self.network().subnets.get, parts["rg"], parts["vnet"],
                               parts["subnet"])
        except ProviderError as e:
            return Check(name="subnet", status=CheckStatus.fail, message=f"{e.reason} Fix: {net_hint}.")
        if subnet is None:
            return Check(name="subnet", status=CheckStatus.fail,
                         message=f"The subnet was not found: check the subnet resource ID, or {net_hint}.")
        try:
            vnet = self._get("reading the VNet", self.network().virtual_networks.get, parts["rg"], parts["vnet"])
        except ProviderError as e:
            return Check(name="subnet", status=CheckStatus.fail,
                         message=f"The subnet exists but its VNet's region could not be read ({e.reason}). "
                                 f"Fix: {net_hint}.")
        location = _region_code(str((vnet or {}).get("location", "")))
        if location != self.region:
            return Check(name="subnet", status=CheckStatus.fail,
                         message=f"The subnet's VNet is in {location or 'an unknown region'}, not {self.region}: a "
                                 "VM's network interface must use a subnet in the VM's region. Choose a subnet in "
                                 f"{self.region} or change the region.")
        if not _dig(subnet, "properties", "natGateway"):
            return Check(name="subnet", status=CheckStatus.warn,
                         message=f"The subnet exists in {self.region} but has no NAT gateway: make sure it has "
                                 "explicit outbound internet access (DNS and HTTPS) through a firewall route, or "
                                 "associate a NAT gateway.")
        return Check(name="subnet", status=CheckStatus.ok,
                     message=f"The subnet exists in {self.region} and has a NAT gateway for outbound access.")

    def _check_prices(self, available: dict[str, dict[str, Any]]) -> Check:
        if not available:
            return Check(name="prices", status=CheckStatus.warn, message="No available GPU size to price.")
        prices = self._prices().vm_hourly(self.region, [s["name"] for s in available.values()])
        disk = self._prices().os_disk(self.region, self.config.os_disk_gb)
        missing = [s["name"] for k, s in available.items() if k not in prices]
        if len(missing) == len(available):
            return Check(name="prices", status=CheckStatus.fail,
                         message=f"No on-demand Linux price found for the available sizes in {self.region}; the "
                                 "catalog will be empty. Try again later or choose another region.")
        msg = (f"Prices loaded for {len(prices)} size(s); OS disk Premium SSD {disk.tier} "
               f"${disk.per_month:.2f}/month.")
        if missing:
            msg += f" No price for: {', '.join(missing)} (left out of the catalog)."
        return Check(name="prices", status=CheckStatus.ok, message=msg)

    def _check_quota(self, available: dict[str, dict[str, Any]]) -> Check:
        if not available:
            return Check(name="quota", status=CheckStatus.warn,
                         message=f"No available GPU size to compare. {QUOTA_NOTE}")
        usages = self._call("reading compute quota", lambda: [_as_dict(u) for u in
                                                               self.compute().usage.list(self.region)])
        free: dict[str, tuple[int, int]] = {}
        for u in usages:
            key = str(_dig(u, "name", "value", default="")).lower()
            limit, current = int(u.get("limit", 0)), int(u.get("currentValue", 0))
            free[key] = (limit - current, limit)
        short: list[str] = []
        enough: list[str] = []
        total_free, _total_limit = free.get("cores", (0, 0))
        for s in available.values():
            family_free, family_limit = free.get(str(s["family"]).lower(), (0, 0))
            if family_free < s["vcpus"]:
                short.append(f"{s['name']} needs {s['vcpus']} vCPUs of {s['family']} (limit {family_limit}, "
                             f"free {max(family_free, 0)})")
            elif total_free < s["vcpus"]:
                short.append(f"{s['name']} needs {s['vcpus']} Total Regional vCPUs (free {max(total_free, 0)})")
            else:
                enough.append(s["name"])
        if short:
            return Check(name="quota", status=CheckStatus.warn,
                         message="Quota shortfall: " + "; ".join(short) + ". Request more in Subscriptions -> "
                                 "Usage + quotas (VM family and Total Regional vCPUs) for "
                                 f"{self.region}. {QUOTA_NOTE}")
        return Check(name="quota", status=CheckStatus.ok,
                     message=f"Quota covers one VM of: {', '.join(enough)}. {QUOTA_NOTE}")

    # ------------------------------------------------------------ catalog

    def _prices(self) -> RetailPrices:
        return RetailPrices(self.endpoints.prices_url, verify=self.endpoints.verify)

    def _available_sizes(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """Supported sizes this subscription may use in the region (by Resource SKUs and their restrictions)."""
        skus = self._call("listing VM sizes (resource SKUs)", lambda: [
            _as_dict(s) for s in self.compute().resource_skus.list(filter=f"location eq '{self.region}'")])
        available: dict[str, dict[str, Any]] = {}
        unavailable: dict[str, str] = {}
        for sku in skus:
            size = supported(str(sku.get("name", "")))
            if size is None or sku.get("resourceType") != "virtualMachines":
                continue
            if self.region not in {_region_code(str(loc)) for loc in sku.get("locations") or []}:
                continue
            caps = {str(c.get("name")): str(c.get("value")) for c in sku.get("capabilities") or []}
            if caps.get("GPUs", "1") != "1" or caps.get("CpuArchitectureType", "x64") != "x64":
                continue  # the table says single-GPU x64; the SKU's own record must agree
            if "V2" not in caps.get("HyperVGenerations", "V2"):
                unavailable[size.name] = "no Gen2 support"
                continue
            zones = set()
            for info in sku.get("locationInfo") or []:
                if _region_code(str(info.get("location", ""))) == self.region:
                    zones |= set(info.get("zones") or [])
            reason = ""
            for r in sku.get("restrictions") or []:
                why = str(r.get("reasonCode", "restricted"))
                if r.get("type") == "Location" and self.region in {_region_code(str(v)) for v in r.get("values") or []}:
                    reason = why
                elif r.get("type") == "Zone":
                    blocked = set(_dig(r, "restrictionInfo", "zones", default=[]) or [])
                    if zones and zones <= blocked:
                        reason = f"{why} in every zone"
            if reason:
                unavailable[size.name] = reason
                continue
            available[size.name.lower()] = {
                "name": size.name, "family": sku.get("family", ""),
                "vcpus": int(caps.get("vCPUs", size.vcpus)), "size": size,
            }
        return available, unavailable

    def offers(self) -> list[GpuOffer]:
        available, _ = self._available_sizes()
        if not available:
            return []
        prices = self._prices()
        hourly = prices.vm_hourly(self.region, [s["name"] for s in available.values()])
        disk = prices.os_disk(self.region, self.config.os_disk_gb)
        out = []
        for key, s in sorted(available.items()):
            if key not in hourly:
                continue  # no price, no offer: an estimate must never be blank
            size = s["size"]
            compute = round(hourly[key], 4)
            disk_h = round(disk.per_hour, 4)
            out.append(GpuOffer(
                provider=self.name, offer_id=f"azure:{self.region}:{size.name}", gpu=size.gpu,
                gpu_memory_gb=size.gpu_memory_gb, machine_type=size.name, region=self.region,
                compute_per_hour=compute, disk_per_hour=disk_h, total_per_hour=round(compute + disk_h, 4),
                note=f"{PRICE_NOTE} OS disk: Premium SSD {disk.tier} ({disk.size_gb} GiB).",
            ))
        return out

    # ------------------------------------------------------------ launch

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        ref = spec.ref
        size = supported(spec.offer.machine_type)
        if size is None:
            raise PermanentError(f"{spec.offer.machine_type} is not a supported Azure GPU size; choose an offer "
                                 "from the current catalog", code="UnsupportedSize")
        if spec.offer.region and spec.offer.region != self.region:
            raise PermanentError(f"the offer is in {spec.offer.region} but the connection uses {self.region}; "
                                 "choose an offer from the current catalog", code="RegionMismatch")
        vm_name, nic_name, _ = self.names(ref)
        log = get_logger()
        # Rendered before anything is created: a bootstrap that cannot be rendered (over the
        # 16 KB bound, a newline in a value) must not leave a NIC behind or escape untranslated.
        try:
            custom_data = base64.b64encode(cloudinit.render(spec.bootstrap).encode()).decode()
        except ValueError as exc:
            raise PermanentError(f"cannot build the VM's custom data: {exc}", code="BadBootstrap") from exc

        vm = self._get_vm(vm_name, instance_view=True)
        if vm is not None:
            if not self._ours(vm.get("tags"), ref):
                raise PermanentError(f"a VM named {vm_name} exists in {self.rg} without this run's tags; "
                                     "Tensorant will not use or change it", code="NameTaken")
            if _dig(vm, "properties", "provisioningState") == "Failed":
                code, message = self._failure(vm)
                self._cleanup_failed(ref)
                raise translate(_LroFailure(code, message), f"creating VM {vm_name}")
            self._tag_disk(ref)
            return self._launched(ref)

        nic = self._get_nic(nic_name)
        if nic is None:
            nic_body = {
                "location": self.region,
                "tags": ref.tags,
                "properties": {
                    "ipConfigurations": [{
                        "name": "ipconfig1",
                        "properties": {"subnet": {"id": self.config.subnet_id},
                                       "privateIPAllocationMethod": "Dynamic"},  # and no public IP, ever
                    }],
                    "enableAcceleratedNetworking": True,
                },
            }
            poller = self._call(f"creating network interface {nic_name}",
                                self.network().network_interfaces.begin_create_or_update, self.rg, nic_name, nic_body)
            self._wait(f"creating network interface {nic_name}", poller)
        elif not self._ours(nic.get("tags"), ref):
            raise PermanentError(f"a network interface named {nic_name} exists in {self.rg} without this run's "
                                 "tags; Tensorant will not use it", code="NameTaken")

        for key in spec.bootstrap.secret_env_keys:
            register_secret(spec.bootstrap.env.get(key))
        vm_body = self._vm_body(ref, size.name, spec.disk_gb or self.config.os_disk_gb, custom_data)
        doing = f"creating VM {vm_name} ({size.name})"
        log.info("azure: creating VM", extra={"vm": vm_name, "size": size.name})
        try:
            poller = self._call(doing, self.compute().virtual_machines.begin_create_or_update, self.rg, vm_name,
                                vm_body)
            done = self._wait(doing, poller)
        except PermanentError:
            # Azure can leave the VM resource (and its disk) after a failed allocation, and the NIC exists
            # already: remove them now so nothing bills; release/sweeper finish anything not yet confirmed.
            self._cleanup_failed(ref)
            raise
        if done:
            self._tag_disk(ref)
        return self._launched(ref)

    def _vm_body(self, ref: RunRef, size: str, disk_gb: int, custom_data: str) -> dict[str, Any]:
        vm_name, nic_name, disk_name = self.names(ref)
        return {
            "location": self.region,
            "tags": ref.tags,
            "properties": {
                "hardwareProfile": {"vmSize": size},
                "storageProfile": {
                    "imageReference": {"id": self.config.image_id},
                    "osDisk": {
                        "name": disk_name,
                        "createOption": "FromImage",
                        "caching": "ReadWrite",
                        "diskSizeGB": disk_gb,
                        "managedDisk": {"storageAccountType": "Premium_LRS"},
                        "deleteOption": "Delete",  # set explicitly; release still confirms it is gone
                    },
                    "dataDisks": [],
                },
                "osProfile": {
                    "computerName": vm_name[:64],
                    "adminUsername": ADMIN_USER,
                    "customData": custom_data,
                    "linuxConfiguration": {
                        "disablePasswordAuthentication": True,
                        "ssh": {"publicKeys": [{"path": f"/home/{ADMIN_USER}/.ssh/authorized_keys",
                                                "keyData": self.config.ssh_public_key}]},
                        "provisionVMAgent": True,
                    },
                },
                "networkProfile": {
                    "networkInterfaces": [{
                        "id": self._rid("Microsoft.Network/networkInterfaces", nic_name),
                        "properties": {"primary": True, "deleteOption": "Delete"},
                    }],
                },
                "securityProfile": {"securityType": "Standard"},
            },
        }

    def _launched(self, ref: RunRef) -> list[CloudResource]:
        """What the run owns: recorded by deterministic ID, so a disk not yet made is still released."""
        return self._expected(ref)

    def _tag_disk(self, ref: RunRef) -> None:
        """Mark the implicit OS disk (Azure cannot tag it in the VM request)."""
        _, _, disk_name = self.names(ref)
        disk = self._get_disk(disk_name)
        if disk is None or self._ours(disk.get("tags"), ref):
            return
        if disk.get("tags") and not self._ours(disk.get("tags")):
            return  # someone else's marks: never overwrite
        poller = self._call(f"tagging disk {disk_name}", self.compute().disks.begin_update, self.rg, disk_name,
                            {"tags": ref.tags})
        self._wait(f"tagging disk {disk_name}", poller)

    def _cleanup_failed(self, ref: RunRef) -> None:
        """Best effort after a failed create: delete VM, then OS disk and NIC; never raises."""
        try:
            self.release(ref, [], _after_failed_create=True)
        except ProviderError as e:
            get_logger().warning("azure: cleanup after failed create incomplete", extra={"reason": e.reason})

    # ------------------------------------------------------------ describe / retain / start

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        vm_name, _, _ = self.names(ref)
        vm = self._get_vm(vm_name, instance_view=True)
        if vm is None:
            return Description(state=MachineState.gone, detail=f"VM {vm_name} not found")
        if not self._ours(vm.get("tags"), ref):
            return Description(state=MachineState.unknown, detail=f"VM {vm_name} lacks this run's tags")
        provisioning = _dig(vm, "properties", "provisioningState", default="")
        res = [self._resource("vm", vm, state=self._power(vm) or provisioning)]
        if provisioning == "Failed":
            code, message = self._failure(vm)
            return Description(state=MachineState.unknown, detail=f"provisioning failed ({code}): {message}",
                               resources=res)
        if provisioning == "Succeeded":
            self._tag_disk(ref)
        power = self._power(vm)
        state = {
            "running": MachineState.running, "starting": MachineState.pending,
            "stopping": MachineState.stopping, "deallocating": MachineState.stopping,
            "stopped": MachineState.stopped, "deallocated": MachineState.stopped,
        }.get(power, MachineState.pending if provisioning in ("Creating", "Updating", "") else MachineState.unknown)
        detail = f"provisioning {provisioning}, power {power or 'unknown'}"
        if power == "stopped":
            detail += " (stopped without deallocation still bills compute)"
        return Description(state=state, detail=detail, resources=res)

    def _billing_note(self) -> str:
        tier, size = disk_tier(self.config.os_disk_gb)
        return (f"GPU compute billing stopped when Azure confirmed Stopped (deallocated). The OS disk (Premium SSD "
                f"{tier}, {size} GiB) and your existing networking still bill until the run is released.")

    def _owned_vm(self, ref: RunRef) -> dict[str, Any] | None:
        vm_name, _, _ = self.names(ref)
        vm = self._get_vm(vm_name, instance_view=True)
        if vm is not None and not self._ours(vm.get("tags"), ref):
            raise PermanentError(f"VM {vm_name} does not carry this run's tags; Tensorant will not change it",
                                 code="NotOurs")
        return vm

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        """Deallocate (not just power off); done only when the instance view says PowerState/deallocated."""
        vm = self._owned_vm(ref)
        if vm is None:
            return Outcome(done=True, detail="VM not found: nothing to deallocate; no disk was kept")
        power = self._power(vm)
        if power == "deallocated":
            return Outcome(done=True, detail="Stopped (deallocated); OS disk kept", billing_note=self._billing_note())
        if power != "deallocating":
            poller = self._call(f"deallocating VM {ref.name}", self.compute().virtual_machines.begin_deallocate,
                                self.rg, ref.name)
            self._wait(f"deallocating VM {ref.name}", poller)
            vm = self._owned_vm(ref) or {}
            if self._power(vm) == "deallocated":
                return Outcome(done=True, detail="Stopped (deallocated); OS disk kept",
                               billing_note=self._billing_note())
        return Outcome(done=False, detail=f"waiting for Azure to confirm deallocation (now {self._power(vm) or '?'})",
                       retry_after_s=30)

    def start(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        vm = self._owned_vm(ref)
        if vm is None:
            raise PermanentError(f"VM {ref.name} no longer exists; it cannot be started", code="NotFound")
        power = self._power(vm)
        if power == "running":
            return Outcome(done=True, detail="running; compute billing has resumed")
        if power != "starting":
            poller = self._call(f"starting VM {ref.name}", self.compute().virtual_machines.begin_start, self.rg,
                                ref.name)
            self._wait(f"starting VM {ref.name}", poller)
            vm = self._owned_vm(ref) or {}
            if self._power(vm) == "running":
                return Outcome(done=True, detail="running; compute billing has resumed")
        return Outcome(done=False, detail=f"waiting for the VM to start (now {self._power(vm) or '?'})",
                       retry_after_s=30)

    # ------------------------------------------------------------ release

    def release(self, ref: RunRef, resources: list[CloudResource], *, _after_failed_create: bool = False) -> Outcome:
        """Delete the VM, then the job-created OS disk and NIC; done only when each GET answers 404."""
        vm_name, nic_name, disk_name = self.names(ref)
        disk_id = self._rid("Microsoft.Compute/disks", disk_name)
        nic_id = self._rid("Microsoft.Network/networkInterfaces", nic_name)

        vm = self._owned_vm(ref)
        if vm is not None:
            self._refuse_changed_attachments(vm, disk_id, nic_id)
            if _dig(vm, "properties", "provisioningState") != "Deleting":
                poller = self._call(f"deleting VM {vm_name}", self.compute().virtual_machines.begin_delete,
                                    self.rg, vm_name)
                self._wait(f"deleting VM {vm_name}", poller)
            if self._get_vm(vm_name) is not None:
                return Outcome(done=False, detail=f"waiting for Azure to delete VM {vm_name}", retry_after_s=30)

        disk = self._get_disk(disk_name)
        if disk is not None:
            if disk.get("tags") and not self._ours(disk.get("tags"), ref):
                raise PermanentError(f"disk {disk_name} carries other tags; Tensorant will not delete it",
                                     code="NotOurs")
            managed_by = disk.get("managedBy") or _dig(disk, "properties", "managedBy")
            if managed_by and not _same_id(managed_by, self._rid("Microsoft.Compute/virtualMachines", vm_name)):
                raise PermanentError(
                    f"Automatic deletion refused: the run's OS disk {disk_name} is attached to {managed_by}. Detach "
                    "it (keep a copy if you need its data), then retry release.", code="AttachmentsChanged")
            if not managed_by:
                poller = self._call(f"deleting disk {disk_name}", self.compute().disks.begin_delete, self.rg,
                                    disk_name)
                self._wait(f"deleting disk {disk_name}", poller)
            if self._get_disk(disk_name) is not None:
                return Outcome(done=False, detail=f"waiting for Azure to delete OS disk {disk_name}",
                               retry_after_s=30)

        nic = self._get_nic(nic_name)
        if nic is not None:
            if not self._ours(nic.get("tags"), ref):
                raise PermanentError(f"network interface {nic_name} lacks this run's tags; Tensorant will not "
                                     "delete it", code="NotOurs")
            attached = _dig(nic, "properties", "virtualMachine", "id")
            if attached and not _same_id(attached, self._rid("Microsoft.Compute/virtualMachines", vm_name)):
                raise PermanentError(
                    f"Automatic deletion refused: the run's network interface {nic_name} is attached to {attached}. "
                    "Detach it, then retry release.", code="AttachmentsChanged")
            outcome = self._delete_nic(nic_name)
            if outcome is not None:
                return outcome
            if self._get_nic(nic_name) is not None:
                return Outcome(done=False, detail=f"waiting for Azure to delete network interface {nic_name}",
                               retry_after_s=30)
        return Outcome(done=True, detail="VM, OS disk and network interface confirmed deleted")

    def _delete_nic(self, nic_name: str) -> Outcome | None:
        from azure.core.exceptions import AzureError

        doing = f"deleting network interface {nic_name}"
        try:
            poller = self.network().network_interfaces.begin_delete(self.rg, nic_name)
            self._wait(doing, poller)
        except (AzureError, ProviderError) as e:
            code = e.code if isinstance(e, ProviderError) else error_code(e)
            if code == "NicReservedForAnotherVm":
                # Azure keeps a NIC reserved for ~180 s after its VM goes: not an error, just "not yet".
                return Outcome(done=False, retry_after_s=60,
                               detail=f"network interface {nic_name} is still reserved for the deleted VM; "
                                      "Azure releases it within a few minutes, retrying")
            if isinstance(e, AzureError):
                if status_code(e) == 404:
                    return None
                err = translate(e, doing)
                if isinstance(err, RetryableError):
                    return Outcome(done=False, detail=err.reason, retry_after_s=err.retry_after_s)
                raise err from None
            raise
        return None

    def _refuse_changed_attachments(self, vm: dict[str, Any], disk_id: str, nic_id: str) -> None:
        props = vm.get("properties") or {}
        os_disk_id = _dig(props, "storageProfile", "osDisk", "managedDisk", "id")
        data_disks = _dig(props, "storageProfile", "dataDisks", default=[]) or []
        nics = [n.get("id") for n in _dig(props, "networkProfile", "networkInterfaces", default=[]) or []]
        problems = []
        if os_disk_id and not _same_id(os_disk_id, disk_id):
            problems.append(f"its OS disk was replaced ({os_disk_id.rsplit('/', 1)[-1]} instead of "
                            f"{disk_id.rsplit('/', 1)[-1]})")
        if data_disks:
            problems.append(f"{len(data_disks)} data disk(s) are attached")
        if nics and (len(nics) != 1 or not _same_id(nics[0], nic_id)):
            problems.append("its network interfaces were changed")
        if problems:
            raise PermanentError(
                f"Automatic deletion refused: the run's VM {vm.get('name')} no longer has only its job-created disk "
                f"and network interface ({'; '.join(problems)}), and deleting it could delete unrelated data. "
                "Restore the original attachments and retry release, or delete the VM yourself in Azure.",
                code="AttachmentsChanged")

    # ------------------------------------------------------------ list_managed

    def list_managed(self) -> Iterable[CloudResource]:
        """VMs, disks and NICs in the training resource group with this deployment's marks (all pages).

        An OS disk that is not tagged yet (see the module docstring) is listed when its name is this
        deployment's deterministic OS disk name, so an orphaned one is found too.
        """
        compute, network = self.compute(), self.network()
        prefix = f"tensorant-{self.settings.deployment_id}-"
        for vm in self._call("listing VMs", lambda: [_as_dict(v) for v in compute.virtual_machines.list(self.rg)]):
            if self._ours(vm.get("tags")):
                yield self._resource("vm", vm)
        for disk in self._call("listing disks",
                               lambda: [_as_dict(d) for d in compute.disks.list_by_resource_group(self.rg)]):
            name = str(disk.get("name", ""))
            if self._ours(disk.get("tags")):
                yield self._resource("disk", disk, state=str(_dig(disk, "properties", "diskState", default="")))
            elif not disk.get("tags") and name.startswith(prefix) and name.endswith("-osdisk"):
                res = self._resource("disk", disk, state=str(_dig(disk, "properties", "diskState", default="")))
                run_id = name[len(prefix):-len("-osdisk")]
                yield res.model_copy(update={"run_id": run_id, "deployment": self.settings.deployment_id,
                                             "managed": True, "extra": {"tagged": "false"}})
        for nic in self._call("listing network interfaces",
                              lambda: [_as_dict(n) for n in network.network_interfaces.list(self.rg)]):
            if self._ours(nic.get("tags")):
                yield self._resource("nic", nic)


class _LroFailure(Exception):
    """A failed provisioning seen in a VM's instance view, shaped like an ARM error for translate()."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.error = type("E", (), {"code": code, "message": message})()
        self.status_code = 0

    def __str__(self) -> str:
        return str(self.error.message)


__all__ = ["TEST_ENDPOINTS", "AzureCompute", "AzureEndpoints"]
