"""Every ARM request the adapter makes needs an action granted by the infra/azure role assigned at its scope.

The fake ARM server records each request; this test maps it to the RBAC action Azure
would check (plus the linked actions Azure checks on referenced resources: joining a
NIC or subnet, reading the image, writing the implicit OS disk) and looks that action
up in the role the connection doc assigns at the request's scope.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shared.errors import CapacityError
from shared.providers.azure.config import AzureConfig
from shared.providers.base import RunRef
from tests.providers.azure.fake_arm import SUB, FakeArm
from tests.providers.azure.rig import GALLERY_VERSION_ID, TRAIN_RG, config_body, make_compute, spec

INFRA = Path(__file__).resolve().parents[3] / "infra" / "azure"
ROLE_AT = {  # where the connection doc assigns each role (the fake keeps image and network in their own groups)
    "training": "tensorant-training-role.json",
    "images-rg": "tensorant-image-reader-role.json",
    "net-rg": "tensorant-network-role.json",
    "subscription": "tensorant-reader-role.json",
}
# Beyond the product document's roles: the auto-shutdown backstop's (shared/providers/azure/backstop.py), optional
# and assigned at the training resource group; without it the provider launches without a backstop.
OPTIONAL_AT_TRAINING = "tensorant-autoshutdown-role.json"


def role_actions(file: str) -> set[str]:
    return {a.lower() for a in json.loads((INFRA / file).read_text())["Actions"]}


def scope_of(resource_id: str) -> str:
    m = re.match(r"^/subscriptions/[^/]+/resourcegroups/([^/]+)/", resource_id.lower())
    if not m:
        return "subscription"
    return "training" if m.group(1) == TRAIN_RG else m.group(1)


def resource_type(path: str) -> tuple[str, list[str]]:
    """('Microsoft.Compute/virtualMachines', [trailing segments]) for a resource or collection path."""
    after = path.split("/providers/", 1)[1].split("/")
    namespace, rest = after[0], after[1:]
    types, extra = [], []
    i = 0
    while i < len(rest):
        types.append(rest[i])
        if i + 1 >= len(rest):
            break
        if rest[i] == "virtualMachines" and i + 2 < len(rest):
            extra = rest[i + 2:]
            break
        i += 2
    return "/".join([namespace, *types]), extra


def actions_for(method: str, path: str, query: str, body: Any) -> list[tuple[str, str]]:
    """(action, scope) pairs Azure would authorize for one request."""
    low = path.lower()
    if "/oauth2/" in low or "openid-configuration" in low or low.startswith("/api/retail/prices"):
        return []  # identity and public prices: no ARM authorization
    if low.startswith("/bootdiag/"):
        return []  # a boot diagnostics blob read through its SAS URI: the signature is the authorization
    m = re.search(r"/providers/(microsoft\.\w+)/locations/[^/]+/(operations|operationresults|usages)", low)
    if m:
        ns = {"microsoft.compute": "Microsoft.Compute", "microsoft.network": "Microsoft.Network"}[m.group(1)]
        kind = {"operations": "operations", "operationresults": "operationResults", "usages": "usages"}[m.group(2)]
        return [(f"{ns}/locations/{kind}/read", "subscription")]
    rtype, extra = resource_type(path)
    scope = scope_of(path)
    out: list[tuple[str, str]] = []
    if extra:  # a VM action or child view
        if extra == ["instanceView"]:
            out.append((f"{rtype}/instanceView/read", scope))
        else:
            out.append((f"{rtype}/{extra[0]}/action", scope))
        return out
    verb = {"GET": "read", "PUT": "write", "PATCH": "write", "DELETE": "delete"}[method]
    out.append((f"{rtype}/{verb}", scope))
    if method == "GET" and "instanceview" in query.lower():
        out.append((f"{rtype}/instanceView/read", scope))
    if method == "PUT" and rtype == "Microsoft.Compute/virtualMachines":
        props = body["properties"]
        for nic in props["networkProfile"]["networkInterfaces"]:
            out.append(("Microsoft.Network/networkInterfaces/join/action", scope_of(nic["id"])))
        image_id = props["storageProfile"]["imageReference"]["id"]
        image_type, _ = resource_type(image_id)
        out.append((f"{image_type}/read", scope_of(image_id)))
        out.append(("Microsoft.Compute/disks/write", scope))  # the implicit OS disk
    if method == "PUT" and rtype == "Microsoft.Network/networkInterfaces":
        for cfg in body["properties"]["ipConfigurations"]:
            subnet = cfg["properties"]["subnet"]["id"]
            out.append(("Microsoft.Network/virtualNetworks/subnets/join/action", scope_of(subnet)))
    return out


def exercise(fake: FakeArm, compute: Any) -> None:
    ref = RunRef("test", "org1", "roles")
    compute.validate()
    compute.offers()
    compute.launch(spec(ref))
    compute.describe(ref, [])
    compute.retain(ref, [])
    compute.start(ref, [])
    list(compute.list_managed())
    fake.keep_nic_on_vm_delete = True
    fake.nic_reserved_s = 0  # the NIC's reservation is test_compute's subject; here every delete must be made
    # as if Azure had not applied the disk's delete option either: release deletes the disk itself
    vm = fake.get(f"/subscriptions/{SUB}/resourceGroups/{TRAIN_RG}/providers/Microsoft.Compute/virtualMachines/{ref.name}")
    assert vm
    vm["properties"]["storageProfile"]["osDisk"]["deleteOption"] = "Detach"
    assert compute.release(ref, []).done
    fake.allocation_failure = "AllocationFailed"
    with pytest.raises(CapacityError):
        compute.launch(spec(RunRef("test", "org1", "alloc")))


@pytest.mark.parametrize("image", ["managed", "gallery"])
def test_every_action_used_is_granted_by_the_role_at_its_scope(fake: FakeArm, image: str) -> None:
    cfg = AzureConfig(**config_body(image_id=GALLERY_VERSION_ID)) if image == "gallery" else None
    compute = make_compute(fake, **({"config": cfg} if cfg else {}))
    exercise(fake, compute)
    used: set[tuple[str, str]] = set()
    for method, path, query, body in fake.requests:
        used.update(actions_for(method, path, query, body))
    missing = sorted((a, s) for a, s in used if a.lower() not in role_actions(ROLE_AT[s])
                     and not (s == "training" and a.lower() in role_actions(OPTIONAL_AT_TRAINING)))
    assert not missing, f"actions not granted by infra/azure roles: {missing}"
    names = {a for a, _ in used}
    # the mapping is not vacuous: the lifecycle's key actions were seen
    for action in ("Microsoft.Compute/virtualMachines/write", "Microsoft.Compute/virtualMachines/deallocate/action",
                   "Microsoft.Compute/virtualMachines/start/action", "Microsoft.Compute/virtualMachines/delete",
                   "Microsoft.Compute/disks/delete", "Microsoft.Compute/disks/write",
                   "Microsoft.Network/networkInterfaces/delete", "Microsoft.Network/virtualNetworks/subnets/join/action",
                   "Microsoft.Network/networkInterfaces/join/action", "Microsoft.Compute/skus/read",
                   "Microsoft.Compute/locations/usages/read", "Microsoft.Network/virtualNetworks/read"):
        assert action in names, action
    if image == "gallery":
        assert {"Microsoft.Compute/galleries/images/read", "Microsoft.Compute/galleries/images/versions/read"} <= names
    else:
        assert "Microsoft.Compute/images/read" in names


def test_an_unlisted_action_would_fail_the_check() -> None:
    used = actions_for("POST", "/subscriptions/s/resourceGroups/tensorant-training/providers/Microsoft.Compute/"
                               "virtualMachines/v/powerOff", "", None)
    assert used == [("Microsoft.Compute/virtualMachines/powerOff/action", "training")]
    assert used[0][0].lower() not in role_actions(ROLE_AT["training"])


def test_the_serial_log_read_needs_an_action_the_documented_role_lacks(fake: FakeArm) -> None:
    """console_output (a VM that never reported) is the one read outside the doc's roles: its action is
    named in infra/azure/README.md as optional, and without it the answer says what is missing."""
    from shared.providers.azure.compute import BOOT_LOG_ACTION
    from shared.providers.base import console_of

    compute = make_compute(fake)
    ref = RunRef("test", "org1", "roles")
    boot = spec(ref).bootstrap
    compute.launch(replace(spec(ref), bootstrap=replace(boot, env={**boot.env, "TENSORANT_API_URL": "https://cp"})))
    fake.requests.clear()
    assert console_of(compute, ref, []).startswith("Azure boot diagnostics, serial console log")
    used = {a for m, p, q, b in fake.requests for a, _ in actions_for(m, p, q, b)}
    assert BOOT_LOG_ACTION in used and BOOT_LOG_ACTION.lower() not in role_actions(ROLE_AT["training"])
    assert BOOT_LOG_ACTION in (INFRA / "README.md").read_text()
    fake.fail("POST", r"/retrievebootdiagnosticsdata$", 403, "AuthorizationFailed")
    assert BOOT_LOG_ACTION in console_of(compute, ref, [])


def test_training_role_is_the_documented_template() -> None:
    role = json.loads((INFRA / "tensorant-training-role.json").read_text())
    assert role["Name"] == "Tensorant Training Resources" and role["IsCustom"] is True
    assert role["AssignableScopes"] == ["/subscriptions/SUBSCRIPTION_ID"]
    assert len(role["Actions"]) == 13 and role["NotActions"] == [] and role["DataActions"] == []
    for file in ROLE_AT.values():
        assert not [a for a in json.loads((INFRA / file).read_text())["Actions"] if "*" in a or "roleAssignments" in a]


def test_the_backstop_needs_only_its_optional_role_beyond_the_documented_ones(fake: FakeArm) -> None:
    from shared.providers.azure.backstop import ACTIONS

    assert {a.lower() for a in ACTIONS} == role_actions(OPTIONAL_AT_TRAINING)
    assert not role_actions(OPTIONAL_AT_TRAINING) & role_actions(ROLE_AT["training"])  # not in the doc's role
    assert OPTIONAL_AT_TRAINING in (INFRA / "README.md").read_text()
