"""Every request body the Azure provider sends through the real azure-mgmt clients, as the fake ARM server
recorded it, checked against the operation's request schema from azure-rest-api-specs
(arm_request_schemas.json: the fragments, their source files and commits, and the api-version the installed
SDK sends). The check is ARM's for what it covers: an unknown property (the Compute RP refuses one: "Could
not find member ..."), a read-only one, a wrong JSON type, a missing required property, a value outside a
closed enum (x-ms-enum modelAsString false; an extensible one is checked against the pinned SDK's enum).
The fragments are from the newest spec files reachable here, older than the api-version the SDK sends, so the
same bodies are also checked against the SDK's own models, which are generated from the pinned api-version:
every key a field there, none read-only."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from shared.clock import now
from shared.providers.base import RunRef
from tests.providers.azure.fake_arm import SUB, FakeArm
from tests.providers.azure.rig import REF, make_compute, spec

SCHEMAS: dict[str, Any] = json.loads(Path(__file__).with_name("arm_request_schemas.json").read_text())
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


def problems(value: Any, schema: dict[str, Any], where: str = "body") -> list[str]:
    """What in `value` the schema refuses, each with its JSON path; [] when it conforms."""
    if "$ref" in schema:
        schema = SCHEMAS["definitions"][schema["$ref"]]
    if schema.get("readOnly"):
        return [f"{where}: read-only, not accepted in a request"]
    kind = schema.get("type")
    if kind and not TYPES[kind](value):
        return [f"{where}: {type(value).__name__}, not {kind}"]
    if "enum" in schema and not schema.get("x-ms-enum", {}).get("modelAsString") and value not in schema["enum"]:
        return [f"{where}: {value!r} is not one of {schema['enum']}"]
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        out += [f"{where}.{name}: required, missing" for name in schema.get("required", []) if name not in value]
        for key, item in value.items():
            if props is not None and key in props:
                out += problems(item, props[key], f"{where}.{key}")
            elif "additionalProperties" in schema:
                out += problems(item, schema["additionalProperties"], f"{where}.{key}")
            elif props is not None:
                out.append(f"{where}.{key}: not a property of this object in the spec")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += problems(item, schema["items"], f"{where}[{i}]")
    return out


def operation_of(method: str, path: str) -> str | None:
    for name, op in SCHEMAS["operations"].items():
        if op["method"] == method and re.match(op["path"], path.lower()):
            return str(name)
    return None


def exercise(fake: FakeArm) -> None:
    """The provider's whole lifecycle, every body-carrying request included (NIC and VM create, disk tag)."""
    compute = make_compute(fake)
    ref = RunRef("test", "org1", "schemas")
    compute.validate()
    compute.launch(replace(spec(ref), must_work_until=now() + timedelta(hours=2)))  # with its auto-shutdown
    compute.describe(ref, [])
    compute.retain(ref, [])
    compute.start(ref, [])
    compute.console_output(ref, [])
    fake.nic_reserved_s = 0
    compute.release(ref, [])


def test_every_body_the_sdk_sends_conforms_to_its_operations_schema(fake: FakeArm) -> None:
    exercise(fake)
    seen: dict[str, set[str]] = {}
    failures: list[str] = []
    for method, path, query, body in fake.requests:
        if "/oauth2/" in path or path.startswith(("/api/retail/", "/bootdiag/")):
            continue
        if body is None:
            continue
        name = operation_of(method, path)
        assert name is not None, f"{method} {path} carries a body and no request schema is vendored for it"
        op = SCHEMAS["operations"][name]
        seen.setdefault(name, set()).update(parse_qs(query).get("api-version", []))
        failures += [f"{name}: {p}" for p in problems(body, {"$ref": op["body"]})]
    assert not failures, failures
    assert set(seen) == set(SCHEMAS["operations"]), f"not exercised: {set(SCHEMAS['operations']) - set(seen)}"
    for name, versions in seen.items():
        pinned = SCHEMAS["operations"][name]["sdk_api_version"]
        assert versions == {pinned}, (f"{name}: the SDK now sends api-version {versions}, the fragments were "
                                      f"checked for {pinned}: re-vendor them from azure-rest-api-specs")


def test_the_check_refuses_what_arm_refuses() -> None:
    compute_body = {
        "location": "eastus",
        "properties": {"hardwareProfile": {"vmSize": "Standard_NC24ads_A100_v4"},
                       "storageProfile": {"osDisk": {"createOption": "FromImage", "caching": "ReadWrite",
                                                     "diskSizeGB": 128}},
                       "osProfile": {"computerName": "x", "linuxConfiguration": {"provisionVMAgent": True}}},
    }
    vm = {"$ref": "VirtualMachine"}
    assert problems(compute_body, vm) == []

    def broken(change: Any) -> list[str]:
        body = copy.deepcopy(compute_body)
        change(body)
        return problems(body, vm)

    assert broken(lambda b: b["properties"]["osProfile"].update(computername="x")) == [
        "body.properties.osProfile.computername: not a property of this object in the spec"]
    assert broken(lambda b: b["properties"].update(provisioningState="Succeeded")) == [
        "body.properties.provisioningState: read-only, not accepted in a request"]
    assert broken(lambda b: b["properties"]["storageProfile"]["osDisk"].update(diskSizeGB="128")) == [
        "body.properties.storageProfile.osDisk.diskSizeGB: str, not integer"]
    assert broken(lambda b: b["properties"]["storageProfile"]["osDisk"].update(caching="Write")) == [
        "body.properties.storageProfile.osDisk.caching: 'Write' is not one of ['None', 'ReadOnly', 'ReadWrite']"]
    assert broken(lambda b: b.pop("location")) == ["body.location: required, missing"]
    assert broken(lambda b: b["properties"]["storageProfile"]["osDisk"].pop("createOption")) == [
        "body.properties.storageProfile.osDisk.createOption: required, missing"]
    assert broken(lambda b: b.update(tags={"a": 1})) == ["body.tags.a: int, not string"]


def test_the_extensible_enum_values_sent_are_known_to_the_pinned_sdk(fake: FakeArm) -> None:
    """An extensible enum (modelAsString) takes values newer than the vendored spec: each value the provider
    sends must be one the installed SDK's api-version knows (securityType Standard is newer than 2025-04-01)."""
    from azure.mgmt.compute import models as cm
    from azure.mgmt.network import models as nm

    compute = make_compute(fake)
    props = compute._vm_body(REF, "Standard_NC24ads_A100_v4", 128, "")["properties"]
    os_disk = props["storageProfile"]["osDisk"]
    assert props["securityProfile"]["securityType"] in {e.value for e in cm.SecurityTypes}
    assert os_disk["createOption"] in {e.value for e in cm.DiskCreateOptionTypes}
    assert os_disk["deleteOption"] in {e.value for e in cm.DiskDeleteOptionTypes}
    assert os_disk["managedDisk"]["storageAccountType"] in {e.value for e in cm.StorageAccountTypes}
    assert props["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"] in {
        e.value for e in cm.DeleteOptions}
    compute.launch(spec())
    nic = next(b for m, p, _, b in fake.requests if m == "PUT" and "/networkinterfaces/" in p.lower())
    allocation = nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAllocationMethod"]
    assert allocation in {e.value for e in nm.IPAllocationMethod}
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"].startswith(f"/subscriptions/{SUB}/")


# ---------------------------------------------------------------- the pinned api-version, from the SDK's models


def sdk_fields(model: Any) -> dict[str, Any]:
    """The wire names of an azure-mgmt model's fields (the installed SDK's models are generated from the
    api-version it pins) -> the field: its visibility and, for a nested model, its class."""
    model.__new__(model)  # the SDK's model base computes the field table on first construction
    return {f._rest_name: f for f in model._attr_to_rest_field.values()}


def nested_model(field: Any) -> type | None:
    """The model class a field holds (a list's: its items'), or None for a plain value."""
    kind = field._class_type
    if not isinstance(kind, type):
        kind = (getattr(kind, "args", None) or (None,))[0]  # a list of models: a partial of the model reader
    return kind if isinstance(kind, type) and any(c.__name__ == "Model" for c in kind.__mro__[1:]) else None


def sdk_problems(value: Any, model: type, where: str = "body") -> list[str]:
    """Keys the pinned api-version's model does not have, or has only as read-only, in a request body."""
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in sdk_problems(item, model, f"{where}[{i}]")]
    if not isinstance(value, dict):
        return []
    fields = sdk_fields(model)
    out: list[str] = []
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            out.append(f"{where}.{key}: not in {model.__name__} of the pinned api-version")
        elif list(field._visibility or []) == ["read"]:
            out.append(f"{where}.{key}: read-only in the pinned api-version")
        elif (inner := nested_model(field)) is not None:
            out += sdk_problems(item, inner, f"{where}.{key}")
    return out


def test_every_body_uses_only_writable_fields_of_the_pinned_api_version(fake: FakeArm) -> None:
    """The vendored fragments are older than the api-version the SDK sends: the same bodies are also
    checked against the SDK's models, which are generated from that api-version."""
    from azure.mgmt.compute import models as cm
    from azure.mgmt.network import models as nm

    models = {"VirtualMachines_CreateOrUpdate": cm.VirtualMachine, "NetworkInterfaces_CreateOrUpdate":
              nm.NetworkInterface, "Disks_Update": cm.DiskUpdate}
    exercise(fake)
    checked: set[str] = set()
    failures: list[str] = []
    for method, path, _, body in fake.requests:
        name = operation_of(method, path) if body is not None else None
        if name is not None and name in models:  # the schedule has no SDK: its fragment is its api-version's
            checked.add(name)
            failures += [f"{name}: {p}" for p in sdk_problems(body, models[name])]
    assert not failures, failures
    assert checked == set(models)
    # the walk reaches nested models: a misspelt key three levels down is found
    vm = make_compute(fake)._vm_body(REF, "Standard_NC24ads_A100_v4", 128, "")
    vm["properties"]["osProfile"]["linuxConfiguration"]["provisionVmAgent"] = True
    vm["properties"]["provisioningState"] = "Succeeded"
    assert sdk_problems(vm, cm.VirtualMachine) == [
        "body.properties.osProfile.linuxConfiguration.provisionVmAgent: not in LinuxConfiguration of the pinned "
        "api-version", "body.properties.provisioningState: read-only in the pinned api-version"]


def test_the_fake_refuses_a_schedule_body_the_vendored_schema_refuses(fake: FakeArm) -> None:
    """The fake ARM checks the auto-shutdown schedule's body itself (as ARM does), with the vendored fragment."""
    from shared.errors import ProviderError
    from shared.providers.azure.backstop import body, schedule_name

    compute = make_compute(fake)
    compute.launch(spec())
    vm_id = f"/subscriptions/{SUB}/resourceGroups/tensorant-training/providers/Microsoft.Compute/virtualMachines/{REF.name}"
    good = body(vm_id, "eastus", REF.tags, now() + timedelta(hours=1))
    path = f"{compute.backstop.base}/{schedule_name(REF.name)}"
    assert compute.backstop._request("PUT", path, good)["properties"]["taskType"] == "ComputeVmShutdownTask"
    for bad in ({**good, "properties": {**good["properties"], "provisioningState": "Succeeded"}},
                {**good, "properties": {**good["properties"], "dailyRecurrence": {"hour": "0100"}}},
                {**good, "properties": {**good["properties"], "targetResourceId": vm_id + "x"}}):
        try:
            compute.backstop._request("PUT", path, bad)
        except ProviderError as exc:
            assert "400" in exc.reason or exc.code in ("InvalidRequestContent", "InvalidTargetResource"), exc.reason
        else:
            raise AssertionError(f"accepted: {bad}")
