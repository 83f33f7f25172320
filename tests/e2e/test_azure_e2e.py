"""End to end on Azure through the real function handlers: the real azure-identity and
azure-mgmt clients talk to the fake ARM server (HTTPS, self-signed certificate) on
loopback, Retail Prices come from the same fake, and a test-side agent plays the VM.

The registry builds the adapter; the test swaps its azure factory for one that passes the
fake's endpoints as AzureCompute's keyword-only `endpoints` argument (the `arm` fixture, through
route_registry_to).
Production code has no module-level hook, so nothing can redirect it by configuration.
"""

from __future__ import annotations

import pytest

from tests.harness import Harness, trained_adapter_zip
from tests.providers.azure.fake_arm import SECRET, SUB, FakeArm
from tests.providers.azure.rig import TRAIN_RG, config_body

pytestmark = pytest.mark.e2e


def test_saved_connection_reports_its_checks_and_hides_the_secret(env: dict[str, str], arm: FakeArm) -> None:
    """What a user sees on saving the connection (azure_h saves the same one)."""
    harness = Harness()
    try:
        assert harness.save_storage({"kind": "local"})["status"] == "connected"
        conn = harness.save_compute("azure", config_body())
    finally:
        harness.close()
    assert conn["status"] == "connected", conn["checks"]
    checks = {c["name"]: c["status"] for c in conn["checks"]}
    assert checks["authentication"] == "ok" and checks["image"] == "ok" and checks["quota"] == "warn"
    assert SECRET not in str(conn)  # write-only secret
    assert any("rotate" in w for w in conn["warnings"])


def _rid(kind: str, name: str) -> str:
    provider = "Microsoft.Network/networkInterfaces" if kind == "nic" else f"Microsoft.Compute/{kind}"
    return f"/subscriptions/{SUB}/resourceGroups/{TRAIN_RG}/providers/{provider}/{name}"


def _launch(harness: Harness, arm: FakeArm) -> tuple[str, dict[str, str]]:
    offers = harness.ok("GET", "/api/catalog/gpus", params={"provider": "azure"})["items"]
    sizes = {o["machine_type"] for o in offers}
    assert sizes == {"Standard_NV36ads_A10_v5", "Standard_NC24ads_A100_v4", "Standard_NC40ads_H100_v5"}
    offer = next(o for o in offers if o["machine_type"] == "Standard_NC24ads_A100_v4")
    assert offer["total_per_hour"] == round(3.673 + 19.71 / 730, 4) and "taxes" in offer["note"]
    run_id = harness.create_run("azure", offer["offer_id"])
    run = harness.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], harness.step_errors)
    ids = {r["kind"]: r["id"] for r in run["resources"]}
    name = f"tensorant-test-{run_id}"
    assert ids == {"vm": _rid("virtualMachines", name), "disk": _rid("disks", f"{name}-osdisk"),
                   "nic": _rid("nic", f"{name}-nic")}
    for rid in ids.values():
        tags = arm.get(rid)["tags"]  # type: ignore[index]
        assert tags["tensorant:run"] == run_id and tags["tensorant:org"] == harness.org
        assert tags["tensorant:deployment"] == "test" and tags["tensorant:managed"] == "true"
    assert len(arm.of_type("Microsoft.Compute/virtualMachines")) == 1
    return run_id, ids


def test_trial_succeeds_with_vm_disk_and_nic_gone(azure_h: Harness, arm: FakeArm) -> None:
    run_id, ids = _launch(azure_h, arm)
    assert arm.get(ids["vm"])["_state"]["power"] == "running"  # type: ignore[index]
    azure_h.agent(run_id).train(trained_adapter_zip())
    run = azure_h.get_run(run_id)
    assert run["state"] == "succeeded", (run["reason"], run["release_error"], azure_h.step_errors)
    assert [arm.get(rid) for rid in ids.values()] == [None, None, None]
    deletes = [p for m, p, _, _ in arm.requests if m == "DELETE"]
    # the VM's auto-shutdown schedule (written at launch: the cloud's own backstop) goes first, then the VM
    assert any(m == "PUT" and "/schedules/shutdown-computevm-" in p for m, p, _, _ in arm.requests)
    assert len(deletes) > 1 and "/schedules/shutdown-computevm-" in deletes[0] and deletes[1] == ids["vm"]
    # nothing of the customer's network or image was changed
    assert not [p for m, p, _, _ in arm.requests if m != "GET" and ("virtualNetworks" in p or "/images/" in p)]


def test_timed_out_trial_is_deallocated_with_its_disk_then_recovered(azure_h: Harness, arm: FakeArm) -> None:
    run_id, ids = _launch(azure_h, arm)
    azure_h.agent(run_id).heartbeat("training", 0.4)
    run = azure_h.expire(run_id)
    assert run["state"] == "retained", (run["reason"], azure_h.step_errors)
    assert arm.get(ids["vm"])["_state"]["power"] == "deallocated"  # type: ignore[index]
    assert arm.get(ids["disk"]) is not None and arm.get(ids["nic"]) is not None  # the disk is kept
    assert "deallocated" in run["billing_note"] and "still bill" in run["billing_note"]

    # Recovery: start the VM on request (billing resumes, training does not) ...
    azure_h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    azure_h.drain()
    assert arm.get(ids["vm"])["_state"]["power"] == "running"  # type: ignore[index]
    # ... then hand in the adapter fetched from it: verified, and the VM, disk and NIC released.
    run = azure_h.recover(run_id, upload=trained_adapter_zip())
    assert run["state"] == "succeeded", (run["reason"], run["release_error"], azure_h.step_errors)
    assert [arm.get(rid) for rid in ids.values()] == [None, None, None]


def test_vm_with_a_swapped_disk_is_not_deleted(azure_h: Harness, arm: FakeArm, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared import queues

    run_id, ids = _launch(azure_h, arm)
    azure_h.agent(run_id).heartbeat("training", 0.4)
    assert azure_h.expire(run_id)["state"] == "retained"
    vm = arm.get(ids["vm"])
    assert vm
    original = vm["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"]
    vm["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"] = _rid("disks", "helper-copy")
    # Release retries a refusal with backoff; keep real delays here so the retry stays queued, not looping.
    queues.configure(delay_scale=1.0)
    run = azure_h.recover(run_id, upload=trained_adapter_zip())
    assert run["state"] == "releasing", (run["reason"], azure_h.step_errors)
    assert "Automatic deletion refused" in run["release_error"] and "OS disk was replaced" in run["release_error"]
    assert arm.get(ids["vm"]) is not None and arm.get(ids["disk"]) is not None
    assert not [p for m, p, _, _ in arm.requests if m == "DELETE"]

    # An administrator restores the original attachment and retries the release: now it completes.
    vm["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"] = original
    queues.configure(delay_scale=0)
    azure_h.ok("POST", f"/api/runs/{run_id}/release", token="member")
    azure_h.drain()
    run = azure_h.get_run(run_id)
    assert run["state"] == "succeeded", (run["reason"], run["release_error"], azure_h.step_errors)
    assert [arm.get(rid) for rid in ids.values()] == [None, None, None]


def test_launch_sends_the_real_image_and_the_runs_training_settings(azure_h: Harness, arm: FakeArm) -> None:
    from shared.settings import get_settings
    from tests.e2e.wire import TRAINING, assert_training_sent, from_user_data

    offers = azure_h.ok("GET", "/api/catalog/gpus", params={"provider": "azure"})["items"]
    offer = next(o for o in offers if o["machine_type"] == "Standard_NC24ads_A100_v4")
    run_id = azure_h.create_run("azure", offer["offer_id"], training=TRAINING)
    run = azure_h.launch(run_id)
    vm = next(r["id"] for r in run["resources"] if r["kind"] == "vm")
    image, env = from_user_data(arm.get(vm)["_custom_data"], azure_h)  # type: ignore[index]
    assert image == get_settings().container_image
    assert_training_sent(env, run)
    assert "HF_TOKEN" not in env  # none saved for this org
