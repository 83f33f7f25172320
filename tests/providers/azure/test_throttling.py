"""Throttling as Azure answers it (fake_arm.FakeArm.throttle): Resource Manager's subscription limit and the
Compute resource provider's policies, through the real SDK clients. A throttled call is retried inline only
for a short Retry-After within the invocation's budget; otherwise it leaves as ThrottledError (retryable,
with Azure's interval), and a run whose launch is throttled waits and goes on: it never fails for it."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import PermanentError, ThrottledError
from shared.models import MachineState
from tests.harness import Harness
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import NIC_ID, REF, VM_ID, make_compute, spec

VM_PATH = r"/virtualmachines/tensorant-test-run-abc$"


def test_resource_manager_throttling_of_a_read_is_retried_inline_for_its_retry_after(fake: FakeArm) -> None:
    slept: list[float] = []
    fake.throttle("GET", VM_PATH, by="arm", retry_after=4, times=2)
    assert make_compute(fake, sleep=slept.append).describe(REF, []).state == MachineState.gone
    assert slept == [4.0, 4.0]


def test_a_compute_policy_throttling_the_create_is_retryable_with_its_interval_and_policy(fake: FakeArm) -> None:
    """The Compute RP's 429 says OperationNotAllowed at the top (its reason is in the details): it must
    be neither a quota refusal nor a failed run, and the reason names the policy and the wait."""
    fake.throttle("PUT", VM_PATH, by="compute", policy="PutVM3Min", retry_after=180)
    compute = make_compute(fake)
    with pytest.raises(ThrottledError) as info:
        compute.launch(spec())
    err = info.value
    assert not isinstance(err, PermanentError)
    assert err.code == "TooManyRequests" and err.retry_after_s == 180.0
    assert "PutVM3Min" in err.reason and "180 s" in err.reason
    # the NIC made before is kept for the retry (nothing failed), and no VM exists yet
    assert fake.get(NIC_ID) is not None and fake.get(VM_ID) is None
    assert [r.kind for r in compute.launch(spec())] == ["vm", "disk", "nic"]
    assert fake.get(VM_ID) is not None


def test_the_policy_is_read_from_the_remaining_calls_header_too(fake: FakeArm) -> None:
    fake.throttle("GET", VM_PATH, by="compute", policy="HighCostGet30Min", retry_after=1200)
    fake.faults[-1].body = {"error": {"code": "OperationNotAllowed", "message": "too many requests"}}  # no details
    with pytest.raises(ThrottledError) as info:
        make_compute(fake).describe(REF, [])
    assert info.value.code == "TooManyRequests" and "HighCostGet30Min" in info.value.reason
    assert info.value.retry_after_s == 1200.0


def test_a_throttled_poll_of_the_create_is_retryable_and_the_next_launch_finds_the_vm(fake: FakeArm) -> None:
    fake.op_polls = 2
    fake.throttle("GET", r"/providers/microsoft.compute/locations/eastus/operations/", by="arm", retry_after=30)
    compute = make_compute(fake)
    with pytest.raises(ThrottledError) as info:
        compute.launch(spec())
    assert info.value.code == "SubscriptionRequestsThrottled" and info.value.retry_after_s == 30.0
    assert fake.get(VM_ID) is not None  # Azure goes on with the create
    assert [r.kind for r in compute.launch(spec())] == ["vm", "disk", "nic"]
    assert len(fake.of_type("Microsoft.Compute/virtualMachines")) == 1


def test_a_run_whose_create_is_throttled_waits_and_launches(azure_h: Harness, arm: FakeArm) -> None:
    """Through the launch step: the run stays provisioning, says why it waits, and is launched once Azure
    lets the create through (the step re-sent itself with Azure's Retry-After)."""
    offers = azure_h.ok("GET", "/api/catalog/gpus", params={"provider": "azure"})["items"]
    offer = next(o for o in offers if o["machine_type"] == "Standard_NC24ads_A100_v4")
    run_id = azure_h.create_run("azure", offer["offer_id"])
    arm.throttle("PUT", r"/virtualmachines/tensorant-", by="compute", policy="PutVM3Min", retry_after=120, times=3)
    started = azure_h.clock.t
    run: dict[str, Any] = azure_h.launch(run_id)
    assert run["state"] == "provisioning" and run["resources"], (run["reason"], azure_h.step_errors)
    assert azure_h.clock.t - started >= 3 * 120  # each retry waited Azure's interval
    waits = [e["message"] for e in run["events"] if "launch will be retried" in e["message"]]
    assert len(waits) == 3 and all("PutVM3Min" in w for w in waits), waits
    assert len(arm.of_type("Microsoft.Compute/virtualMachines")) == 1
