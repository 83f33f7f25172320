"""Through the real function handlers: a compute connection re-saved
into another scope must never lose a held machine (Azure on the fake ARM, RunPod on the fake
RunPod server), the provisioning-deadline reason carries the cloud's own words, and RunPod's
prepaid credit is checked at launch and watched on retained runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shared.models import Role
from shared.security import Principal
from shared.settings import get_settings, reset_settings
from shared.store import get_store
from tests.harness import ApiError, Harness
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import SUB, TRAIN_RG, config_body
from tests.providers.runpod.fake_server import FakeRunPod


def _rid(kind: str, name: str, rg: str = TRAIN_RG) -> str:
    provider = "Microsoft.Network/networkInterfaces" if kind == "nic" else f"Microsoft.Compute/{kind}"
    return f"/subscriptions/{SUB}/resourceGroups/{rg}/providers/{provider}/{name}"


def _retained_run(harness: Harness, arm: FakeArm) -> tuple[str, list[str]]:
    offer = next(o for o in harness.ok("GET", "/api/catalog/gpus", params={"provider": "azure"})["items"]
                 if o["machine_type"] == "Standard_NC24ads_A100_v4")
    run_id = harness.create_run("azure", offer["offer_id"])
    assert harness.launch(run_id)["state"] == "provisioning"
    harness.agent(run_id).heartbeat("training", 0.4)
    assert harness.expire(run_id)["state"] == "retained"
    name = f"tensorant-test-{run_id}"
    ids = [_rid("virtualMachines", name), _rid("disks", f"{name}-osdisk"), _rid("nic", f"{name}-nic")]
    assert all(arm.get(i) is not None for i in ids)
    return run_id, ids


def _resave_unguarded(harness: Harness, provider: str, body: dict[str, Any]) -> None:
    """Store a connection the way a save did before the guard existed (no held-machine check)."""
    from shared.providers import registry
    from shared.runs.org_backends import compute_connection_slot
    from shared.services.api.connections import _save

    _save(harness.ctx, Principal(sub="owner@a", org=harness.org, role=Role.owner), compute_connection_slot(provider), provider,
          registry.config_model(provider).model_validate(body))
    harness.drain()


def _cancel_discard(harness: Harness, run_id: str) -> Any:
    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": True})
    harness.drain()
    return harness.get_run(run_id)


def test_run_records_the_scope_its_machine_was_created_in(azure_h: Harness, arm: FakeArm) -> None:
    run_id, _ = _retained_run(azure_h, arm)
    run, _ = get_store().runs.get(azure_h.org, run_id)
    assert run.scope == {"subscription": SUB, "resource_group": TRAIN_RG, "region": "eastus"}


def test_resave_with_another_resource_group_is_refused_and_nothing_leaks(azure_h: Harness, arm: FakeArm) -> None:
    """The failure this guards against: retained run, connection re-saved with another resource group,
    cancel with discard -> the run ended "cancelled" while its VM, disk and NIC still existed."""
    run_id, ids = _retained_run(azure_h, arm)
    with pytest.raises(ApiError) as err:
        azure_h.ok("PUT", "/api/connections/compute/azure", json_body=config_body(resource_group="other-rg"))
    assert err.value.status == 409
    detail = str(err.value.body)
    assert "resource_group tensorant-training -> other-rg" in detail and run_id in detail
    assert "cancel" in detail and "release" in detail
    # Nothing was saved: the connection still points at the run's resource group ...
    assert azure_h.ok("GET", "/api/connections/compute/azure")["config"]["resource_group"] == TRAIN_RG
    # ... so cancel with discard really deletes the VM, its disk and its NIC.
    run = _cancel_discard(azure_h, run_id)
    assert run["state"] == "cancelled", (run["reason"], run["release_error"], azure_h.step_errors)
    assert [arm.get(i) for i in ids] == [None, None, None]
    # With nothing held any more, the scope may change.
    assert azure_h.save_compute("azure", config_body(resource_group="other-rg"))["config"]["resource_group"] == "other-rg"


def test_release_refuses_to_act_in_another_scope(azure_h: Harness, arm: FakeArm) -> None:
    run_id, ids = _retained_run(azure_h, arm)
    _resave_unguarded(azure_h, "azure", config_body(resource_group="other-rg"))
    from shared import queues

    queues.configure(delay_scale=1.0)  # keep the release's retry queued instead of looping
    run = _cancel_discard(azure_h, run_id)
    assert run["state"] == "releasing", run  # not "cancelled" while the VM bills on
    assert "refusing to act in another scope" in run["release_error"] and "other-rg" in run["release_error"]
    assert all(arm.get(i) is not None for i in ids)
    assert not [p for m, p, _, _ in arm.requests if m == "DELETE"]
    # The connection's own check says why.
    conn = azure_h.ok("GET", "/api/connections/compute/azure")
    held = {c["name"]: c for c in conn["checks"]}["held machines"]
    assert held["status"] == "fail" and run_id in held["message"] and "another scope" in held["message"]
    # The owner saves the connection back; the retried release completes in the run's own scope.
    _resave_unguarded(azure_h, "azure", config_body())
    queues.configure(delay_scale=0)
    azure_h.ok("POST", f"/api/runs/{run_id}/release", token="member")
    azure_h.drain()
    run = azure_h.get_run(run_id)
    assert run["state"] == "cancelled", (run["reason"], run["release_error"], azure_h.step_errors)
    assert [arm.get(i) for i in ids] == [None, None, None]


def test_retain_and_sweeper_never_judge_a_machine_from_another_scope(azure_h: Harness, arm: FakeArm) -> None:
    offer = next(o for o in azure_h.ok("GET", "/api/catalog/gpus", params={"provider": "azure"})["items"]
                 if o["machine_type"] == "Standard_NC24ads_A100_v4")
    run_id = azure_h.create_run("azure", offer["offer_id"])
    azure_h.launch(run_id)
    azure_h.agent(run_id).heartbeat("training", 0.4)
    vm = _rid("virtualMachines", f"tensorant-test-{run_id}")
    _resave_unguarded(azure_h, "azure", config_body(resource_group="other-rg"))
    # The sweeper lists other-rg, misses the VM: it must not call it gone and fail the run.
    azure_h.clock.advance(600)
    azure_h.agent(run_id).heartbeat("training", 0.5)
    azure_h.tick("sweeper")
    azure_h.drain()
    assert azure_h.get_run(run_id)["state"] == "training"
    # The runtime limit passes: retain refuses to stop (or to declare gone) from the wrong scope.
    run = azure_h.expire(run_id)
    assert run["state"] == "retaining", (run["reason"], azure_h.step_errors)
    events = azure_h.ok("GET", f"/api/runs/{run_id}")
    assert "refusing to act in another scope" in str(events)
    assert arm.get(vm) is not None


def test_new_credentials_must_see_every_held_machine(azure_h: Harness, arm: FakeArm) -> None:
    run_id, _ = _retained_run(azure_h, arm)
    # A secret the identity endpoint rejects cannot prove anything: refused, old one kept.
    with pytest.raises(ApiError) as err:
        azure_h.ok("PUT", "/api/connections/compute/azure", json_body=config_body(client_secret="abc8Q~wrong-secret-000"))
    assert err.value.status == 409 and run_id in str(err.value.body)
    # Rotation: Azure now accepts only the new secret; the same scope, and it sees the VM: accepted.
    arm.client_secret = "abc8Q~rotated-secret-0123456789abcdefgh"
    conn = azure_h.save_compute("azure", config_body(client_secret="abc8Q~rotated-secret-0123456789abcdefgh"))
    held = {c["name"]: c for c in conn["checks"]}["held machines"]
    assert conn["status"] == "connected" and held["status"] == "ok" and run_id in held["message"]
    # A VM deleted behind the control plane's back is not "seen": the save says so.
    arm.resources.pop(_rid("virtualMachines", f"tensorant-test-{run_id}").lower())
    with pytest.raises(ApiError) as err:
        azure_h.ok("PUT", "/api/connections/compute/azure",
             json_body=config_body(client_secret="abc8Q~rotated-secret-0123456789abcdefgh"))
    assert err.value.status == 409 and "cannot see the machines" in str(err.value.body)


def test_provisioning_deadline_reason_has_the_clouds_words(azure_h: Harness, arm: FakeArm) -> None:
    offer = next(o for o in azure_h.ok("GET", "/api/catalog/gpus", params={"provider": "azure"})["items"]
                 if o["machine_type"] == "Standard_NC24ads_A100_v4")
    run_id = azure_h.create_run("azure", offer["offer_id"])
    azure_h.launch(run_id)
    vm = arm.get(_rid("virtualMachines", f"tensorant-test-{run_id}"))
    assert vm is not None
    vm["_iv_extra"] = {"vmAgent": {"statuses": [{"code": "ProvisioningState/Unavailable",
                                                 "displayStatus": "Not Ready"}]}}
    azure_h.serve(get_settings().provisioning_timeout_s + 1)  # past the boot deadline, the agent never reported
    azure_h.drain()
    run = azure_h.get_run(run_id)
    reason = run["reason"]
    # Released at its first-report deadline: the machine never exchanged its bootstrap claim.
    assert run["state"] == "failed" and "first-report deadline" in reason
    assert "the cloud says: VM tensorant-test-" in reason and "VM agent: Not Ready" in reason, reason


# ---------------------------------------------------------------- RunPod: account scope and credit

RP_KEY = "rpa_SCOPEKEY0123456789"


@pytest.fixture
def rp(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Harness, FakeRunPod]]:
    fake = FakeRunPod(api_key=RP_KEY).start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)
    reset_settings()
    harness = Harness()
    assert harness.save_storage({"kind": "local"})["status"] == "connected"
    conn = harness.save_compute("runpod", {"api_key": RP_KEY})
    assert conn["status"] == "connected", conn["checks"]
    yield harness, fake
    harness.close()
    fake.stop()


def _rp_offer(harness: Harness) -> str:
    offers = harness.ok("GET", "/api/catalog/gpus", params={"provider": "runpod"})["items"]
    return str(next(o for o in offers if o["machine_type"] == "NVIDIA A40")["offer_id"])


def test_runpod_balance_shown_at_save(rp: tuple[Harness, FakeRunPod]) -> None:
    h, fake = rp
    checks = {c["name"]: c for c in h.ok("GET", "/api/connections/compute/runpod")["checks"]}
    assert checks["balance"]["status"] == "ok" and "$100.00" in checks["balance"]["message"]


def test_runpod_launch_refused_when_credit_cannot_cover_the_run(rp: tuple[Harness, FakeRunPod]) -> None:
    h, fake = rp
    fake.balance = 1.0
    run_id = h.create_run("runpod", _rp_offer(h), runtime_limit_s=7200, price_limit=2.0)
    run = h.launch(run_id)
    assert run["state"] in ("releasing", "failed"), run
    assert "$1.00 of prepaid credit" in run["reason"] and "$2.00/h x runtime limit 2.00 h = $4.00" in run["reason"]
    assert fake.creates() == []


def test_runpod_key_of_another_account_refused_while_a_pod_is_held(rp: tuple[Harness, FakeRunPod]) -> None:
    h, fake = rp
    run_id = h.create_run("runpod", _rp_offer(h))
    assert h.launch(run_id)["state"] == "provisioning"
    assert get_store().runs.get(h.org, run_id)[0].scope == {"account": "user_fake"}
    fake.api_key, fake.account_id = "rpa_OTHERACCOUNT0123456", "user_other"
    with pytest.raises(ApiError) as err:
        h.ok("PUT", "/api/connections/compute/runpod", json_body={"api_key": "rpa_OTHERACCOUNT0123456"})
    assert err.value.status == 409 and "account user_fake -> user_other" in str(err.value.body)
    assert run_id in str(err.value.body)


def test_runpod_low_credit_warns_retained_runs(rp: tuple[Harness, FakeRunPod]) -> None:
    h, fake = rp
    run_id = h.create_run("runpod", _rp_offer(h))
    h.launch(run_id)
    h.agent(run_id).heartbeat("training", 0.3)
    assert h.expire(run_id)["state"] == "retained"
    fake.balance = 50.0
    h.tick("sweeper")
    h.drain()  # the timer sends one sweep-account message per connection

    def credit_warnings() -> list[str]:
        return [e.message for e in get_store().events.read(run_id, kind="warning") if "prepaid credit" in e.message]

    assert credit_warnings() == []
    fake.balance = 4.0
    for _ in range(2):  # once a day, not once a tick
        h.tick("sweeper")
        h.drain()
    assert len(credit_warnings()) == 1 and "$4.00" in credit_warnings()[0] and "retained" in credit_warnings()[0]
