"""One claim rule (shared/store/leases.py: ends, left) for the leases table, the run's launch claim and the
org's launch reservations; the launch claim outlasts the claiming invocation's cloud waits (issue 44 item 4:
it held 60 s while a create may wait on the cloud for 80 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.budget import TIMEOUT_SETTING, invocation_bound_s, step_budget_s
from shared.services.steps.launch import LISTING_LAG_S, launch_settle_s
from shared.store import leases
from tests.chaos.provider import ChaosCloud, ChaosCompute
from tests.fakes import Cloud, serve_memory
from tests.harness import Harness


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    yield from serve_memory(ChaosCloud(), ChaosCompute)


def test_the_launch_settle_time_is_the_invocation_bound_plus_the_listing_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIMEOUT_SETTING, raising=False)
    assert step_budget_s() == 80.0  # host.json's 5 min: what a launch's create may wait on the cloud
    assert launch_settle_s() == invocation_bound_s() + LISTING_LAG_S == 160.0
    assert launch_settle_s() >= step_budget_s() + LISTING_LAG_S
    # A longer functionTimeout lets the create wait longer: the claim holds longer with it.
    monkeypatch.setenv(TIMEOUT_SETTING, "00:10:00")
    assert step_budget_s() == 180.0
    assert launch_settle_s() == 260.0


def test_a_claim_is_held_until_it_ends_and_free_from_then(harness: Harness) -> None:
    t = harness.clock()
    until = leases.ends(t, 30)
    assert leases.left(until) == 30
    harness.clock.advance(29.5)
    assert leases.left(until) == 0.5
    harness.clock.advance(0.5)
    assert leases.left(until) == 0  # free at its end, as a lease row is taken again then
    lease = leases.take(harness.ctx, "claims-test", 30)
    assert lease is not None and leases.take(harness.ctx, "claims-test", 30) is None
    harness.clock.advance(30)
    assert leases.take(harness.ctx, "claims-test", 30) is not None


def test_a_create_that_waited_the_whole_cloud_budget_is_not_created_twice(harness: Harness, cloud: ChaosCloud) -> None:
    """The first create waits on the cloud for the whole step budget (80 s), makes the machine and times
    out; the machine is missing from listings for LISTING_LAG_S after that. The retry (30 s later: 110 s
    after the claim) must not get a claim, or it finds nothing and creates a second machine, as it did
    when the claim held 60 s."""
    cloud.invisible_s = LISTING_LAG_S
    fired: list[str] = []

    def pick(method: str, run_id: str) -> str | None:
        if method == "launch" and not fired:
            fired.append(run_id)
            harness.clock.advance(step_budget_s())  # the create's wait on the cloud
            return "timeout"
        return None

    cloud.pick = pick
    run_id = harness.create_run("memory", "mem-a10")
    harness.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    for _ in range(int(launch_settle_s() // 10) + 3):
        harness.deliver_round(16)
        harness.clock.advance(10)
    run = harness.get_run(run_id)
    assert fired == [run_id]
    assert run["state"] == "provisioning" and run["resources"], run["reason"]
    assert cloud.created[run_id] == 1 and len(cloud.machines) == 1


def test_a_create_the_cloud_is_still_working_on_asks_again_after_the_listing_lag(
        harness: Harness, cloud: ChaosCloud) -> None:
    """Azure answers "the network interface is still being created" (InProgress) and the step asks again:
    that invocation is over, so the next claim waits for the listing lag from its answer, not the rest
    of the settle time (each Azure round would take 160 s)."""
    from shared.budget import IN_PROGRESS
    from shared.errors import RetryableError

    calls: list[float] = []
    answered: list[float] = []

    def pick(method: str, run_id: str) -> str | None:
        if method == "launch":
            calls.append(harness.clock())
            if len(calls) == 1:
                harness.clock.advance(20)  # one long-running operation's wait
                answered.append(harness.clock())
                raise RetryableError("network interface nic-1 is still being created", code=IN_PROGRESS,
                                     retry_after_s=15)
        return None

    cloud.pick = pick
    run_id = harness.create_run("memory", "mem-a10")
    harness.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    for _ in range(int(launch_settle_s() // 10) + 3):
        harness.deliver_round(16)
        harness.clock.advance(10)
    run = harness.get_run(run_id)
    assert run["state"] == "provisioning" and run["resources"], run["reason"]
    assert len(calls) == 2 and cloud.created[run_id] == 1
    waited = calls[1] - answered[0]
    assert LISTING_LAG_S - 0.001 <= waited <= LISTING_LAG_S + 10, waited  # to the microsecond
