"""The provider contract suite for Azure, on the fake ARM server (tests/providers/contract.py).

Azure names are deterministic per resource group, so a foreign VM cannot share our run's VM
name in the training resource group: the "unmarked" foreigner has the run's exact name in
another resource group plus an untagged look-alike beside ours; the "other-deployment" one
carries another deployment's marks for the same org and run id.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from shared.providers.base import RunRef
from tests.providers.azure.fake_arm import FakeArm, Fault
from tests.providers.azure.rig import IMAGE_ID, TRAIN_RG, make_compute, spec
from tests.providers.contract import CloudContract, Foreign, Handed, ProviderEnv

VM = "Microsoft.Compute/virtualMachines"
DISK = "Microsoft.Compute/disks"
NIC = "Microsoft.Network/networkInterfaces"
# The HTTP status ARM answers each refusal kind with (a create's capacity or quota refusal is a 409 Conflict).
STATUS = {"capacity": 409, "quota": 409, "auth": 403, "not_found": 404, "throttled": 429}


def _foreign_vm(fake: FakeArm, rg: str, name: str, tags: dict[str, str]) -> list[str]:
    """A running VM with its OS disk and NIC, put straight into the fake (no provider involved)."""
    vm_id, disk_id, nic_id = (fake.rid(rg, VM, name), fake.rid(rg, DISK, f"{name}-osdisk"),
                              fake.rid(rg, NIC, f"{name}-nic"))
    fake.put(disk_id, {"type": DISK, "location": "eastus", "tags": tags, "managedBy": vm_id,
                       "properties": {"provisioningState": "Succeeded", "diskState": "Attached"}})
    fake.put(nic_id, {"type": NIC, "location": "eastus", "tags": tags,
                      "properties": {"provisioningState": "Succeeded", "virtualMachine": {"id": vm_id}}})
    fake.put(vm_id, {"type": VM, "location": "eastus", "tags": tags, "_state": {"power": "running"}, "properties": {
        "provisioningState": "Succeeded",
        "storageProfile": {"imageReference": {"id": IMAGE_ID}, "dataDisks": [],
                           "osDisk": {"name": f"{name}-osdisk", "managedDisk": {"id": disk_id}}},
        "networkProfile": {"networkInterfaces": [{"id": nic_id}]}}})
    return [vm_id, disk_id, nic_id]


class TestAzureContract(CloudContract):
    @pytest.fixture
    def provider_env(self, fake: FakeArm) -> Iterator[ProviderEnv]:
        def existing(provider_type: str, name: str) -> list[str]:
            body = fake.get(fake.rid(TRAIN_RG, provider_type, name))
            return [str(body["id"])] if body is not None else []

        def machines(ref: RunRef) -> list[str]:
            return existing(VM, ref.name)

        def disks(ref: RunRef) -> list[str]:
            return existing(DISK, f"{ref.name}-osdisk")

        def everything() -> dict[str, str]:
            with fake.lock:
                bodies = list(fake.resources.values())
            return {str(b["id"]): f"{(b.get('properties') or {}).get('provisioningState', '')}/"
                                  f"{(b.get('_state') or {}).get('power', '')}/{sorted((b.get('tags') or {}).items())}"
                    for b in bodies if "id" in b}

        def add_foreign(kind: Foreign, ref: RunRef) -> list[str]:
            if kind == "unmarked":
                # The run's very name, in another resource group; and an untagged VM beside ours.
                return (_foreign_vm(fake, "customer-rg", ref.name, {})
                        + _foreign_vm(fake, TRAIN_RG, f"customer-{ref.run_id}", {"owner": "someone"}))
            other = RunRef(ref.deployment + "x", ref.org, ref.run_id)
            return _foreign_vm(fake, TRAIN_RG, other.name, other.tags)

        def list_requests() -> int:
            return sum(1 for m, p, _, _ in fake.requests if m == "GET" and p.lower().endswith("/virtualmachines"))

        def handed(ref: RunRef) -> Handed:
            # The VM's osProfile.customData as the fake ARM recorded it from the create (base64).
            vm = fake.get(fake.rid(TRAIN_RG, VM, ref.name))
            assert vm is not None, "no VM"
            custom = vm.get("_custom_data")
            return Handed(user_data=base64.b64decode(custom).decode() if custom else None)

        @contextmanager
        def slow_release() -> Iterator[None]:
            # Azure accepts the delete (202) but the operation stays InProgress until released.
            fake.hold_ops = True
            try:
                yield
            finally:
                fake.finish_ops()

        @contextmanager
        def refuse(kind: str, code: str) -> Iterator[None]:
            # Every ARM request (not the token's) answers ARM's error body with the code.
            faults = [Fault(method, "", STATUS[kind], code, message=f"{code} (the contract's refusal)",
                            times=10**6, headers={"Retry-After": "1"} if kind == "throttled" else {})
                      for method in ("GET", "PUT", "PATCH", "POST", "DELETE")]
            fake.faults.extend(faults)
            try:
                yield
            finally:
                for fault in faults:
                    fake.faults.remove(fault)

        provider: Any = make_compute(fake, lro_wait_s=0.2)
        yield ProviderEnv(
            provider=provider, ref=RunRef("test", "org-1", "run-c1"), spec=spec, machines=machines, disks=disks,
            everything=everything, add_foreign=add_foreign, page_size=fake.page_size, handed=handed, list_requests=list_requests,
            slow_release=slow_release, refuse=refuse)
