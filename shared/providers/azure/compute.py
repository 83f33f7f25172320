"""Azure compute lifecycle: one private GPU VM per run, from the customer's image, in the customer's subnet.

The provider's other roles live beside this module: config.py (what a user saves), client.py
(the one door to the SDK: lazy clients, bounded waits, 429 handling), errors.py (translation),
catalog.py (sizes and offers), pricing.py (Retail Prices API), checks.py (connection checks).

How it meets the ComputeProvider contracts (shared/providers/base.py):
- Names are deterministic from RunRef.name: VM `<name>`, NIC `<name>-nic`, OS disk
  `<name>-osdisk`, all in the training resource group. launch looks for them first, so a
  repeated launch finds the same VM instead of creating a second one.
- Marks: the VM and NIC carry RunRef.tags at creation. Azure has no way to tag the
  implicit OS disk in the VM request (VM tags do not propagate), so the disk is tagged by
  a PATCH as soon as it exists (end of launch, or the next describe). Until then it is
  recognised by its deterministic name AND by being the OS disk of our tagged VM; it is
  also bound to that VM with deleteOption=Delete, so deleting the VM removes it.
- Long-running operations: begin_* then a bounded wait (AzureEndpoints.lro_wait_s, 20 s, and never
  past the invocation's budget, shared/budget.py). If Azure has not finished, retain/start/release
  return CloudProgress(done=False) and the step asks again later; a launch whose network interface
  is not ready yet raises RetryableError(code="InProgress") (the launch step sends itself a delayed
  message and the next launch finds the NIC by name); a launch whose VM create is accepted but not
  finished returns the recorded resources and describe reports progress (and a VM whose
  provisioning failed is cleaned up by the next launch or by release). Release starts the disk's
  and the NIC's deletes together once the VM is gone and waits on them as one.
- Failed creation: Azure can create the VM resource even when allocation fails, so a
  permanent failure deletes the VM, its OS disk and the NIC before raising. Whatever
  cannot be confirmed gone at once (a NIC reserved for the failed VM) is found again by
  release or the sweeper through its name and tags.
- Release refuses automatic deletion by raising PermanentError(code="AttachmentsChanged")
  when the VM's OS disk or NIC is not the job-created one or extra data disks are
  attached: the release step shows the reason on the run, nothing is retried in a loop,
  and "retry release" works once the attachments are restored.
- Throttling (429): see client.py (short Retry-After retried inline, long ones raise
  ThrottledError(retry_after_s=Retry-After)).
- Only the training resource group's VMs, disks and NICs with this deployment's marks are
  ever changed; the resource group, image, subnet, VNet, NSG and NAT gateway are only read.
- VMs get managed boot diagnostics (nothing to create: Azure keeps the serial log); describe's
  reason carries the instance view, and console_output (optional, see base.console_of) the
  serial console log's last lines for a VM that never reported.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from shared.budget import IN_PROGRESS
from shared.errors import AuthError, PermanentError, ProviderError, RetryableError
from shared.log import get_logger, register_secret
from shared.models import Check, CheckStatus, CloudResource, GpuOffer, MachineState
from shared.providers import bootstrap_env, cloudinit, console
from shared.providers.azure import catalog, checks
from shared.providers.azure.backstop import Backstop
from shared.providers.azure.client import AzureClient, AzureEndpoints, as_dict, dig, region_code, same_id
from shared.providers.azure.config import AzureConfig
from shared.providers.azure.errors import ProvisioningFailure, translate
from shared.providers.azure.pricing import disk_tier
from shared.providers.base import (
    TAG_DEPLOYMENT,
    TAG_MANAGED,
    TAG_ORG,
    TAG_RUN,
    CloudProgress,
    ComputeProvider,
    Description,
    LaunchSpec,
    RunRef,
    attempt_of_tags,
    marks_extra,
    split_attempt,
)
from shared.settings import Settings

ADMIN_USER = "tensorant"
# Azure's limits on what launch sends (a request over them is refused with InvalidParameter, after the NIC was
# made): OSProfile.customData decodes to at most 65,535 bytes (azure-rest-api-specs, ComputeRP
# computeRPCommon.json), 87,380 base64 characters; a Linux VM name and its computer name have at most 64
# characters, and a host name is letters, digits and inner hyphens (learn.microsoft.com resource-name-rules).
CUSTOM_DATA_MAX_BYTES = 65535
VM_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?")
NIC_RESERVED = "NicReservedForAnotherVm"
BOOT_LOG_ACTION = "Microsoft.Compute/virtualMachines/retrieveBootDiagnosticsData/action"
SAS_MINUTES = 5  # the serial log's SAS URI is read at once

# The instance view's PowerState/<x> -> MachineState.
STATE_MAP: dict[str, MachineState] = {
    "running": MachineState.running,
    "starting": MachineState.pending,
    "stopping": MachineState.stopping,
    "deallocating": MachineState.stopping,
    "stopped": MachineState.stopped,  # powered off but not deallocated: still bills compute
    "deallocated": MachineState.stopped,
}
# No power state yet: the provisioning state decides (a VM being created or updated is pending;
# "Failed" is reported by describe with its reason; anything else is unknown).
PROVISIONING_STATE_MAP: dict[str, MachineState] = {
    "": MachineState.pending,
    "Creating": MachineState.pending,
    "Updating": MachineState.pending,
}


def machine_state(power: str, provisioning: str) -> MachineState:
    if power in STATE_MAP:
        return STATE_MAP[power]
    return PROVISIONING_STATE_MAP.get(provisioning, MachineState.unknown)


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


class AzureCompute:
    """The ComputeProvider for Azure (one connection: subscription, training resource group, region)."""

    name = "azure"
    first_report_s = cloudinit.FIRST_REPORT_S  # the claim's exchange is the first report (cloudinit.py)

    def __init__(self, config: AzureConfig, settings: Settings, *, endpoints: AzureEndpoints | None = None) -> None:
        """endpoints: where the SDK talks and how long it waits; None = public Azure (tests pass a fake ARM)."""
        self.config = config
        self.settings = settings
        self.client = AzureClient(config, endpoints or AzureEndpoints())
        self.rg = config.resource_group
        self.region = config.region
        self.backstop = Backstop(self.client, config.subscription_id, self.rg, self.region)

    # ------------------------------------------------------------ scope

    def scope(self) -> dict[str, str]:
        """Where this connection creates VMs: subscription, training resource group, region (from the
        config; resource-group names compare case-insensitively in Azure)."""
        return {"subscription": self.config.subscription_id, "resource_group": self.rg.lower(),
                "region": self.region}

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
            region=region_code(str(body.get("location", self.region))), run_id=tags.get(TAG_RUN, ""),
            org=tags.get(TAG_ORG, ""), deployment=tags.get(TAG_DEPLOYMENT, ""),
            managed=tags.get(TAG_MANAGED) == "true", created_at=_parse_time(props.get("timeCreated")),
            state=state or str(props.get("provisioningState", "")), attempt=attempt_of_tags(tags),
            extra=marks_extra(tags),
        )

    def _expected(self, ref: RunRef) -> list[CloudResource]:
        vm, nic, disk = self.names(ref)
        common: dict[str, Any] = dict(provider=self.name, region=self.region, run_id=ref.run_id, org=ref.org,
                      deployment=ref.deployment, attempt=ref.attempt)
        return [
            CloudResource(kind="vm", id=self._rid("Microsoft.Compute/virtualMachines", vm), name=vm, **common),
            CloudResource(kind="disk", id=self._rid("Microsoft.Compute/disks", disk), name=disk, **common),
            CloudResource(kind="nic", id=self._rid("Microsoft.Network/networkInterfaces", nic), name=nic, **common),
        ]

    # ------------------------------------------------------------ reads

    def _get_vm(self, name: str, *, instance_view: bool = False) -> dict[str, Any] | None:
        kw = {"expand": "instanceView"} if instance_view else {}
        return self.client.get(f"reading VM {name}", self.client.compute().virtual_machines.get, self.rg, name, **kw)

    def _get_disk(self, name: str) -> dict[str, Any] | None:
        return self.client.get(f"reading disk {name}", self.client.compute().disks.get, self.rg, name)

    def _get_nic(self, name: str) -> dict[str, Any] | None:
        return self.client.get(f"reading network interface {name}", self.client.network().network_interfaces.get, self.rg, name)

    @staticmethod
    def _statuses(vm: dict[str, Any]) -> list[str]:
        return [str(s.get("code", "")) for s in dig(vm, "properties", "instanceView", "statuses", default=[]) or []]

    @classmethod
    def _power(cls, vm: dict[str, Any]) -> str:
        for code in cls._statuses(vm):
            if code.startswith("PowerState/"):
                return code.split("/", 1)[1]
        return ""

    @classmethod
    def _failure(cls, vm: dict[str, Any]) -> tuple[str, str]:
        """(code, message) of a VM whose provisioning failed, from its instance view."""
        for s in dig(vm, "properties", "instanceView", "statuses", default=[]) or []:
            code = str(s.get("code", ""))
            if code.startswith("ProvisioningState/failed"):
                return code.split("/")[-1], str(s.get("message", ""))
        return "ProvisioningFailed", "the VM's provisioning failed"

    # ------------------------------------------------------------ validate / offers

    def validate(self) -> list[Check]:
        """Read-only connection checks with fix hints (checks.py); creates nothing billable.

        Not idempotent in a meaningful sense: it reads the cloud as it is now. Vendor errors become
        failed checks, not exceptions (except an identity endpoint that cannot be reached at all).
        """
        found = checks.run_checks(self.client, self.config, self.settings.public_url)
        if found and found[0].status != CheckStatus.fail:  # signed in: the backstop's grant (a warn when missing)
            found.append(self.backstop.check())
        return found

    def offers(self) -> list[GpuOffer]:
        """Supported single-GPU sizes this subscription may use in the region, priced (catalog.py).

        A read; a size without a price is left out. Raises RetryableError/ProviderError when the
        prices cannot be loaded (the catalog keeps its previous entries).
        """
        return catalog.offers(self.client, self.client.prices(), self.region, self.config.os_disk_gb)

    def preflight(self, offer: GpuOffer, ref: RunRef | None = None) -> str | None:
        """Why one more VM of the offer's size does not fit this region's compute usages (its VM family's
        vCPUs and the Total Regional vCPUs: Microsoft.Compute/locations/usages/read, in the documented
        role), or None. A read, never raises (a failed read knows nothing: None). A VM of `ref` that
        already exists is the run's own: nothing to refuse."""
        size = catalog.supported(offer.machine_type)
        if size is None or not size.family or (offer.region and offer.region != self.region):
            return None  # launch refuses an unsupported size or another region with its own reason
        try:
            if ref is not None and self._get_vm(self.names(ref)[0]) is not None:
                return None
            usages: list[dict[str, Any]] = self.client.call(
                "reading compute quota", lambda: [as_dict(u) for u in self.client.compute().usage.list(self.region)])
        except ProviderError as exc:
            get_logger().info("azure preflight: the usages could not be read", extra={"reason": exc.reason[:200]})
            return None
        return catalog.quota_shortfall(usages, size, self.region)

    # ------------------------------------------------------------ launch

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        """Create (or find) the run's VM, NIC and OS disk; return the three resources recorded for it.

        Idempotent per run: the deterministic names are looked up first, so a repeated launch finds
        the same VM (a VM whose provisioning failed is cleaned up and its failure raised). A VM or NIC
        of that name without this run's tags raises PermanentError(code="NameTaken"). A network
        interface not ready within the wait raises RetryableError(code="InProgress") (launch again
        later: it is found by name); a VM create Azure has not finished within the wait returns the
        resources anyway (describe reports progress).
        A permanent failure deletes what was created before raising; errors are shared.errors.
        """
        ref = spec.ref
        size = catalog.supported(spec.offer.machine_type)
        if size is None:
            raise PermanentError(f"{spec.offer.machine_type} is not a supported Azure GPU size; choose an offer "
                                 "from the current catalog", code="UnsupportedSize")
        if spec.offer.region and spec.offer.region != self.region:
            raise PermanentError(f"the offer is in {spec.offer.region} but the connection uses {self.region}; "
                                 "choose an offer from the current catalog", code="RegionMismatch")
        vm_name, nic_name, _ = self.names(ref)
        log = get_logger()
        if not VM_NAME.fullmatch(vm_name):
            raise PermanentError(f"the run's VM name {vm_name!r} is not one Azure accepts as a Linux VM and host name "
                                 "(1-64 lower-case letters, digits and inner hyphens); nothing was created",
                                 code="BadName")
        # Rendered before anything is created: a bootstrap that cannot be rendered (over the
        # 16 KB bound, a newline in a value) or that Azure would refuse must not leave a NIC behind.
        try:
            claim = bootstrap_env.claim(spec.ref.org, spec.ref.run_id)
            user_data = cloudinit.render(spec.bootstrap, claim).encode()
        except ValueError as exc:
            raise PermanentError(f"cannot build the VM's custom data: {exc}", code="BadBootstrap") from exc
        if len(user_data) > CUSTOM_DATA_MAX_BYTES:
            raise PermanentError(f"the VM's custom data is {len(user_data)} bytes, over Azure's {CUSTOM_DATA_MAX_BYTES}; "
                                 "nothing was created", code="BadBootstrap")
        custom_data = base64.b64encode(user_data).decode()
        security = self._security_profile()  # before anything is created: a refusal leaves nothing

        vm = self._get_vm(vm_name, instance_view=True)
        if vm is not None:
            if not self._ours(vm.get("tags"), ref):
                raise PermanentError(f"a VM named {vm_name} exists in {self.rg} without this run's tags; "
                                     "Tensorant will not use or change it", code="NameTaken")
            if dig(vm, "properties", "provisioningState") == "Failed":
                code, message = self._failure(vm)
                self._cleanup_failed(ref)
                raise translate(ProvisioningFailure(code, message), f"creating VM {vm_name}")
            self._tag_disk(ref)
            self.arm_backstop(ref, spec.must_work_until)
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
                    "enableAcceleratedNetworking": self._accelerated_networking(size.name),
                },
            }
            poller = self.client.call(f"creating network interface {nic_name}",
                                      self.client.network().network_interfaces.begin_create_or_update, self.rg,
                                      nic_name, nic_body)
            if not self.client.wait(f"creating network interface {nic_name}", poller):
                raise self._nic_not_ready(nic_name)
        elif not self._ours(nic.get("tags"), ref):
            raise PermanentError(f"a network interface named {nic_name} exists in {self.rg} without this run's "
                                 "tags; Tensorant will not use it", code="NameTaken")
        elif dig(nic, "properties", "provisioningState") in ("Creating", "Updating"):
            raise self._nic_not_ready(nic_name)

        for key in spec.bootstrap.secret_env_keys:
            register_secret(spec.bootstrap.env.get(key))
        vm_body = self._vm_body(ref, size.name, spec.disk_gb or self.config.os_disk_gb, custom_data)
        vm_body["properties"]["securityProfile"] = security
        doing = f"creating VM {vm_name} ({size.name})"
        log.info("azure: creating VM", extra={"vm": vm_name, "size": size.name})
        try:
            poller = self.client.call(doing, self.client.compute().virtual_machines.begin_create_or_update,
                                      self.rg, vm_name, vm_body)
            done = self.client.wait(doing, poller)
        except PermanentError:
            # Azure can leave the VM resource (and its disk) after a failed allocation, and the NIC exists
            # already: remove them now so nothing bills; release/sweeper finish anything not yet confirmed.
            self._cleanup_failed(ref)
            raise
        if done:
            self._tag_disk(ref)
        self.arm_backstop(ref, spec.must_work_until)  # the VM resource exists once its create is accepted
        return self._launched(ref)

    def arm_backstop(self, ref: RunRef, until: datetime | None) -> str:
        """Write (or move) the VM's auto-shutdown schedule to deallocate it at `until` (the run's hard deadline)
        plus a margin (backstop.py); at launch, and by the control plane after it starts the VM again. Never
        raises; returns what was done, in words."""
        vm_name = self.names(ref)[0]
        return self.backstop.arm(vm_name, self._rid("Microsoft.Compute/virtualMachines", vm_name), ref.tags, until)

    def _security_profile(self) -> dict[str, Any]:
        """The VM's securityProfile as its image requires: a gallery image whose definition allows Trusted
        Launch only is refused a Standard VM (400 at create), so it gets TrustedLaunch, with Secure Boot off
        (the NVIDIA driver's DKMS-built modules are unsigned) and the vTPM on. Read at each launch: the
        definition can change after the connection's check."""
        gallery = self.config.gallery_parts
        if not gallery:
            return {"securityType": "Standard"}  # a managed image: Standard only
        definition = self.client.get("reading the gallery image definition",
                                     self.client.compute(gallery["sub"]).gallery_images.get,
                                     gallery["rg"], gallery["gallery"], gallery["image"]) or {}
        security = checks.image_security_type(definition)
        if security == checks.CONFIDENTIAL_ONLY:
            raise PermanentError(f"cannot launch: {checks.CONFIDENTIAL_FIX}; nothing was created",
                                 code="UnsupportedSecurityType")
        if security == checks.TRUSTED_LAUNCH_ONLY:
            return {"securityType": "TrustedLaunch", "uefiSettings": {"secureBootEnabled": False, "vTpmEnabled": True}}
        return {"securityType": "Standard"}

    def _accelerated_networking(self, size: str) -> bool:
        """Whether the size's own SKU record says AcceleratedNetworkingEnabled: asked of a size that lacks
        it, Azure refuses the VM create (a size added to the table later must not fail there)."""
        available, _ = catalog.available_sizes(self.client, self.region)
        found = available.get(size.lower())
        return bool(found and found.accelerated_networking)

    @staticmethod
    def _nic_not_ready(nic_name: str) -> RetryableError:
        # Not a failure: the step re-sends itself with this delay instead of waiting here.
        return RetryableError(f"network interface {nic_name} is still being created; the VM is created next",
                              code=IN_PROGRESS, retry_after_s=15)

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
                    "computerName": vm_name,  # VM_NAME: a valid Linux host name too
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
                # Managed boot diagnostics (no storage URI: Azure keeps the serial log and screenshot in
                # storage it manages, nothing to create or pay for here): the serial console log is what
                # console_output reads for a VM that never reported.
                "diagnosticsProfile": {"bootDiagnostics": {"enabled": True}},
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
        poller = self.client.call(f"tagging disk {disk_name}", self.client.compute().disks.begin_update, self.rg,
                                  disk_name, {"tags": ref.tags})
        self.client.wait(f"tagging disk {disk_name}", poller)

    def _cleanup_failed(self, ref: RunRef) -> None:
        """Best effort after a failed create: delete VM, then OS disk and NIC; never raises."""
        try:
            self.release(ref, [])
        except ProviderError as e:
            get_logger().warning("azure: cleanup after failed create incomplete", extra={"reason": e.reason})

    # ------------------------------------------------------------ describe / retain / start

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        """The VM's state from its instance view (STATE_MAP); a read, except that it tags the OS disk
        once provisioning has succeeded (idempotent). Not found = MachineState.gone; a VM without this
        run's tags or whose provisioning failed = MachineState.unknown with the reason in detail."""
        vm_name, _, _ = self.names(ref)
        vm = self._get_vm(vm_name, instance_view=True)
        if vm is None:
            return Description(state=MachineState.gone, detail=f"VM {vm_name} not found")
        if not self._ours(vm.get("tags"), ref):
            return Description(state=MachineState.unknown, detail=f"VM {vm_name} lacks this run's tags")
        provisioning = dig(vm, "properties", "provisioningState", default="")
        res = [self._resource("vm", vm, state=self._power(vm) or provisioning)]
        reason = self._reason(vm)
        if provisioning == "Failed":
            code, message = self._failure(vm)
            return Description(state=MachineState.unknown, detail=f"provisioning failed ({code}): {message}",
                               resources=res, reason=reason)
        if provisioning == "Succeeded":
            self._tag_disk(ref)
        power = self._power(vm)
        state = machine_state(power, provisioning)
        detail = f"provisioning {provisioning}, power {power or 'unknown'}"
        if power == "stopped":
            detail += " (stopped without deallocation still bills compute)"
        return Description(state=state, detail=detail, resources=res, reason=reason)

    @staticmethod
    def _reason(vm: dict[str, Any]) -> str:
        """Azure's own account of the VM, from its instance view: every status (code, display status,
        message), the VM agent's statuses and the boot diagnostics status."""

        def text(statuses: Any) -> list[str]:
            out = []
            for st in statuses or []:
                words = str(st.get("displayStatus") or st.get("code") or "")
                if st.get("message"):
                    words += f" ({st['message']})"
                if words:
                    out.append(words)
            return out

        iv = dig(vm, "properties", "instanceView", default={}) or {}
        parts = [f"VM {vm.get('name', '?')}: " + (", ".join(text(iv.get("statuses"))) or "no instance view status")]
        agent = text(dig(iv, "vmAgent", "statuses", default=[]))
        parts.append("VM agent: " + (", ".join(agent) if agent else "not reporting (the guest agent or cloud-init "
                                     "has not started: check the image and boot diagnostics)"))
        boot = dig(iv, "bootDiagnostics", "status", default=None)
        if isinstance(boot, dict) and (boot.get("code") or boot.get("message")):
            parts.append(f"boot diagnostics: {boot.get('displayStatus') or boot.get('code')}"
                         + (f" ({boot['message']})" if boot.get("message") else ""))
        elif not dig(vm, "properties", "diagnosticsProfile", "bootDiagnostics", "enabled", default=False):
            parts.append("boot diagnostics: not enabled on the VM")
        return console.bounded("; ".join(parts))  # Azure's messages are free text: scrubbed and bounded

    def console_output(self, ref: RunRef, resources: list[CloudResource]) -> str:
        """The last lines of the VM's serial console log (managed boot diagnostics: POST
        retrieveBootDiagnosticsData gives a short-lived SAS URI, read from its end), for a VM that never
        reported; see base.console_of. Only the run's own tagged VM is read. "" when there is no VM;
        never raises ("console output unavailable: <why>").

        The action it needs, Microsoft.Compute/virtualMachines/retrieveBootDiagnosticsData/action, is not
        in the connection doc's training role (infra/azure/README.md): without it the answer says so.
        """
        vm_name, _, _ = self.names(ref)
        doing = f"reading the boot diagnostics of VM {vm_name}"
        try:
            vm = self._owned_vm(ref)
            if vm is None:
                return ""
            if not dig(vm, "properties", "diagnosticsProfile", "bootDiagnostics", "enabled", default=False):
                return f"{console.UNAVAILABLE}boot diagnostics are not enabled on VM {vm_name}"
            got = self.client.call(doing, self.client.compute().virtual_machines.retrieve_boot_diagnostics_data,
                                   self.rg, vm_name, sas_uri_expiration_time_in_minutes=SAS_MINUTES)
            uri = str(as_dict(got).get("serialConsoleLogBlobUri") or "")
            if not uri:
                return f"Azure has no serial console log for VM {vm_name} yet"
            text = self.client.read_tail(uri, console.TAIL_BYTES, console.READ_TIMEOUT_S)
        except ProviderError as exc:
            hint = (f" (the training role needs {BOOT_LOG_ACTION} to read it; see infra/azure/README.md)"
                    if isinstance(exc, AuthError) else "")
            return console.UNAVAILABLE + console.bounded(exc.reason, 300) + hint
        if not text.strip():
            return f"the serial console log of VM {vm_name} is empty so far"
        return f"Azure boot diagnostics, serial console log of VM {vm_name} (last lines):\n" + console.tail_lines(text)

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

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        """Deallocate (not just power off) and keep the OS disk; done only when the instance view says
        PowerState/deallocated.

        Idempotent: an already deallocated VM is done without a request, one deallocating is not asked
        again. Not found = done (nothing to keep). done=False = Azure has not confirmed yet; ask again
        after retry_after_s. A VM without this run's tags raises PermanentError(code="NotOurs").
        """
        vm = self._owned_vm(ref)
        if vm is None:
            return CloudProgress(done=True, detail="VM not found: nothing to deallocate; no disk was kept")
        power = self._power(vm)
        if power == "deallocated":
            return CloudProgress(done=True, detail="Stopped (deallocated); OS disk kept", billing_note=self._billing_note())
        if power != "deallocating":
            poller = self.client.call(f"deallocating VM {ref.name}",
                                      self.client.compute().virtual_machines.begin_deallocate, self.rg, ref.name)
            self.client.wait(f"deallocating VM {ref.name}", poller)
            vm = self._owned_vm(ref) or {}
            if self._power(vm) == "deallocated":
                return CloudProgress(done=True, detail="Stopped (deallocated); OS disk kept",
                               billing_note=self._billing_note())
        return CloudProgress(done=False, detail=f"waiting for Azure to confirm deallocation (now {self._power(vm) or '?'})",
                       retry_after_s=30)

    def start(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        """Start a retained (deallocated) VM again, for recovery; done when its power state is running.

        Idempotent: a running VM is done without a request, one starting is not asked again. Not found
        raises PermanentError(code="NotFound") (there is nothing to start). done=False = not running yet;
        ask again after retry_after_s. A VM without this run's tags raises PermanentError(code="NotOurs").
        """
        vm = self._owned_vm(ref)
        if vm is None:
            raise PermanentError(f"VM {ref.name} no longer exists; it cannot be started", code="NotFound")
        power = self._power(vm)
        if power == "running":
            return CloudProgress(done=True, detail="running; compute billing has resumed")
        if power != "starting":
            poller = self.client.call(f"starting VM {ref.name}", self.client.compute().virtual_machines.begin_start,
                                      self.rg, ref.name)
            self.client.wait(f"starting VM {ref.name}", poller)
            vm = self._owned_vm(ref) or {}
            if self._power(vm) == "running":
                return CloudProgress(done=True, detail="running; compute billing has resumed")
        return CloudProgress(done=False, detail=f"waiting for the VM to start (now {self._power(vm) or '?'})",
                       retry_after_s=30)

    # ------------------------------------------------------------ release

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        """Delete the VM, then the job-created OS disk and NIC; done only when each GET answers 404.

        Idempotent; not found = done (a missing VM, disk or NIC counts as deleted). done=False = a delete
        is still running, or the NIC is still reserved for the deleted VM; ask again after retry_after_s.
        Changed attachments (another OS disk, data disks, other NICs) or resources without this run's
        tags raise PermanentError (code "AttachmentsChanged" / "NotOurs") and nothing is deleted.
        """
        vm_name, nic_name, disk_name = self.names(ref)
        disk_id = self._rid("Microsoft.Compute/disks", disk_name)
        nic_id = self._rid("Microsoft.Network/networkInterfaces", nic_name)

        vm = self._owned_vm(ref)
        if vm is not None:
            self._refuse_changed_attachments(vm, disk_id, nic_id)
            self.backstop.remove(vm_name)  # first: no schedule outlives its VM's release
            if dig(vm, "properties", "provisioningState") != "Deleting":
                poller = self.client.call(f"deleting VM {vm_name}",
                                          self.client.compute().virtual_machines.begin_delete, self.rg, vm_name)
                self.client.wait(f"deleting VM {vm_name}", poller)
            if self._get_vm(vm_name) is not None:
                return CloudProgress(done=False, detail=f"waiting for Azure to delete VM {vm_name}", retry_after_s=30)

        disk = self._get_disk(disk_name)
        managed_by = None
        if disk is not None:
            if disk.get("tags") and not self._ours(disk.get("tags"), ref):
                raise PermanentError(f"disk {disk_name} carries other tags; Tensorant will not delete it",
                                     code="NotOurs")
            managed_by = disk.get("managedBy") or dig(disk, "properties", "managedBy")
            if managed_by and not same_id(managed_by, self._rid("Microsoft.Compute/virtualMachines", vm_name)):
                raise PermanentError(
                    f"Automatic deletion refused: the run's OS disk {disk_name} is attached to {managed_by}. Detach "
                    "it (keep a copy if you need its data), then retry release.", code="AttachmentsChanged")
        nic = self._get_nic(nic_name)
        if nic is not None:
            if not self._ours(nic.get("tags"), ref):
                raise PermanentError(f"network interface {nic_name} lacks this run's tags; Tensorant will not "
                                     "delete it", code="NotOurs")
            attached = dig(nic, "properties", "virtualMachine", "id")
            if attached and not same_id(attached, self._rid("Microsoft.Compute/virtualMachines", vm_name)):
                raise PermanentError(
                    f"Automatic deletion refused: the run's network interface {nic_name} is attached to {attached}. "
                    "Detach it, then retry release.", code="AttachmentsChanged")

        # The VM is gone, so the disk's and the NIC's deletes can both run: start them, then wait on
        # them together (one lro_wait_s within the budget, not one each).
        until = self.client.wait_until()
        if disk is not None and not managed_by:
            poller = self.client.call(f"deleting disk {disk_name}", self.client.compute().disks.begin_delete,
                                      self.rg, disk_name)
        else:
            poller = None
        nic_delete = self._start_nic_delete(nic_name) if nic is not None else None
        if poller is not None:
            self.client.wait(f"deleting disk {disk_name}", poller, until=until)
        outcome = self._finish_nic_delete(nic_name, nic_delete, until)
        if disk is not None and self._get_disk(disk_name) is not None:
            return CloudProgress(done=False, detail=f"waiting for Azure to delete OS disk {disk_name}",
                                 retry_after_s=30)
        if outcome is not None:
            return outcome
        if nic is not None and self._get_nic(nic_name) is not None:
            return CloudProgress(done=False, detail=f"waiting for Azure to delete network interface {nic_name}",
                                 retry_after_s=30)
        return CloudProgress(done=True, detail="VM, OS disk and network interface confirmed deleted")

    def _nic_reserved(self, nic_name: str) -> CloudProgress:
        return CloudProgress(done=False, retry_after_s=60,
                             detail=f"network interface {nic_name} is still reserved for the deleted VM; "
                                    "Azure releases it within a few minutes, retrying")

    def _start_nic_delete(self, nic_name: str) -> Any:
        """Ask Azure to delete the NIC: its poller, None when it is already gone, or a CloudProgress = not yet."""
        try:
            # One request, no inline retry: a refusal worth retrying becomes "not yet" for the release step.
            return self.client.call_once(f"deleting network interface {nic_name}",
                                         self.client.network().network_interfaces.begin_delete, self.rg, nic_name)
        except ProviderError as e:
            if e.code == NIC_RESERVED:
                # Azure keeps a NIC reserved for ~180 s after its VM goes: not an error, just "not yet".
                return self._nic_reserved(nic_name)
            if isinstance(e, RetryableError):
                return CloudProgress(done=False, detail=e.reason, retry_after_s=e.retry_after_s)
            raise

    def _finish_nic_delete(self, nic_name: str, started: Any, until: float) -> CloudProgress | None:
        """Wait (until `until`) for the NIC delete _start_nic_delete started; None = deleted, gone or
        still running (the caller's GET decides), a CloudProgress = not yet, with its reason."""
        if started is None or isinstance(started, CloudProgress):
            return started
        try:
            self.client.wait(f"deleting network interface {nic_name}", started, until=until)
        except ProviderError as e:
            if e.code == NIC_RESERVED:
                return self._nic_reserved(nic_name)
            raise
        return None

    def _refuse_changed_attachments(self, vm: dict[str, Any], disk_id: str, nic_id: str) -> None:
        props = vm.get("properties") or {}
        os_disk_id = dig(props, "storageProfile", "osDisk", "managedDisk", "id")
        data_disks = dig(props, "storageProfile", "dataDisks", default=[]) or []
        nics = [n.get("id") for n in dig(props, "networkProfile", "networkInterfaces", default=[]) or []]
        problems = []
        if os_disk_id and not same_id(os_disk_id, disk_id):
            problems.append(f"its OS disk was replaced ({os_disk_id.rsplit('/', 1)[-1]} instead of "
                            f"{disk_id.rsplit('/', 1)[-1]})")
        if data_disks:
            problems.append(f"{len(data_disks)} data disk(s) are attached")
        if nics and (len(nics) != 1 or not same_id(nics[0], nic_id)):
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

        A read. An OS disk that is not tagged yet (see the module docstring) is listed when its name is
        this deployment's deterministic OS disk name, so an orphaned one is found too. Nothing found =
        nothing yielded; errors are shared.errors.
        """
        compute, network = self.client.compute(), self.client.network()
        prefix = f"tensorant-{self.settings.deployment_id}-"
        for vm in self.client.call("listing VMs",
                                   lambda: [as_dict(v) for v in compute.virtual_machines.list(self.rg)]):
            if self._ours(vm.get("tags")):
                yield self._resource("vm", vm)
        for disk in self.client.call("listing disks",
                                     lambda: [as_dict(d) for d in compute.disks.list_by_resource_group(self.rg)]):
            name = str(disk.get("name", ""))
            if self._ours(disk.get("tags")):
                yield self._resource("disk", disk, state=str(dig(disk, "properties", "diskState", default="")))
            elif not disk.get("tags") and name.startswith(prefix) and name.endswith("-osdisk"):
                res = self._resource("disk", disk, state=str(dig(disk, "properties", "diskState", default="")))
                run_id, attempt = split_attempt(name[len(prefix):-len("-osdisk")])
                yield res.model_copy(update={"run_id": run_id, "attempt": attempt, "deployment": self.settings.deployment_id,
                                             "managed": True, "extra": {"tagged": "false"}})
        for nic in self.client.call("listing network interfaces",
                                    lambda: [as_dict(n) for n in network.network_interfaces.list(self.rg)]):
            if self._ours(nic.get("tags")):
                yield self._resource("nic", nic)


__all__ = ["STATE_MAP", "AzureCompute", "AzureEndpoints", "machine_state"]


def build(config: BaseModel, settings: Settings, **deps: Any) -> ComputeProvider:
    """The registry's factory: mypy checks AzureCompute against the Protocol here."""
    if not isinstance(config, AzureConfig):
        raise TypeError(f"azure needs an AzureConfig, not {type(config).__name__}")
    return AzureCompute(config, settings, **deps)
