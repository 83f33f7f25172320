"""The cloud's own backstop on Azure (shared/providers/azure/backstop.py): the VM's auto-shutdown schedule is
created at launch at the run's hard deadline plus the margin, moved when the control plane starts the VM again,
removed on release, all in the fake ARM, which checks each body against the vendored request schema; without
the optional grant the launch goes on and the connection check warns, saying what that costs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.clock import now
from shared.models import CheckStatus
from shared.providers.azure import backstop
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import REF, SUB, TRAIN_RG, VM_ID, spec
from tests.support.clock import FakeClock

SCHEDULE_ID = (f"/subscriptions/{SUB}/resourceGroups/{TRAIN_RG}/providers/Microsoft.DevTestLab/schedules/"
               f"shutdown-computevm-{REF.name}")


def schedule(fake: FakeArm) -> dict[str, Any] | None:
    return fake.get(SCHEDULE_ID)


def time_of(fake: FakeArm) -> Any:
    got = schedule(fake)
    assert got is not None, "no auto-shutdown schedule"
    return got["properties"]["dailyRecurrence"]


def test_launch_creates_the_schedule_resume_moves_it_release_removes_it(fake: FakeArm, compute: Any,
                                                                      sim_clock: FakeClock) -> None:
    sim_clock.t = datetime(2026, 12, 6, 9, 0, 10, tzinfo=UTC).timestamp()
    until = now() + timedelta(hours=3)  # the run's hard deadline (provisioning + runtime + export margin)
    compute.launch(replace(spec(), must_work_until=until))
    got = schedule(fake)
    assert got is not None, "no auto-shutdown schedule"
    props = got["properties"]
    assert props["taskType"] == "ComputeVmShutdownTask" and props["status"] == "Enabled"
    assert props["targetResourceId"] == VM_ID and props["timeZoneId"] == "UTC"
    assert props["dailyRecurrence"] == {"time": "1231"}  # 12:00:10 + 30 min, rounded up to the minute
    assert got["tags"]["tensorant:run"] == REF.run_id

    compute.launch(replace(spec(), must_work_until=until))  # a repeated launch writes the same schedule
    assert time_of(fake) == {"time": "1231"}

    sim_clock.advance(2 * 3600)  # retained, then resumed: the new deadline counts from now
    compute.retain(REF, [])
    compute.start(REF, [])
    note = compute.arm_backstop(REF, now() + timedelta(hours=5))
    assert "16:31" in note and time_of(fake) == {"time": "1631"}

    fake.nic_reserved_s = 0
    assert compute.release(REF, []).done
    assert schedule(fake) is None
    deletes = [p for m, p, _, _ in fake.requests if m == "DELETE"]
    assert deletes.index(SCHEDULE_ID) < deletes.index(VM_ID)  # no schedule outlives its VM's release
    assert compute.release(REF, []).done  # missing = done


def test_a_deadline_a_day_or_more_away_gets_no_daily_schedule(fake: FakeArm, compute: Any,
                                                              sim_clock: FakeClock) -> None:
    """The schedule is daily: one armed for a deadline two days out would deallocate the VM tomorrow."""
    compute.launch(replace(spec(), must_work_until=now() + timedelta(days=2)))
    assert schedule(fake) is None
    assert compute.describe(REF, []).state.value in ("pending", "running")
    note = compute.arm_backstop(REF, now() + timedelta(hours=23))  # within a day (incl. the margin): armed
    assert "auto-shutdown (deallocate) at" in note and schedule(fake) is not None
    assert backstop.fire_at(now() + timedelta(hours=23, minutes=31)) is None  # just past a day: not armed


def test_without_the_grant_the_launch_goes_on_and_the_check_warns(fake: FakeArm, compute: Any,
                                                                 sim_clock: FakeClock) -> None:
    fake.fail("PUT", r"/microsoft\.devtestlab/schedules/", 403, "AuthorizationFailed", times=5)
    resources = compute.launch(replace(spec(), must_work_until=now() + timedelta(hours=2)))
    assert {r.kind for r in resources} == {"vm", "disk", "nic"}  # launched, without its backstop
    assert schedule(fake) is None
    fake.fail("GET", r"/microsoft\.devtestlab/schedules$", 403, "AuthorizationFailed", times=5)
    check = next(c for c in compute.validate() if c.name == "auto_shutdown")
    assert check.status == CheckStatus.warn
    assert "tensorant-autoshutdown-role.json" in check.message and "keeps billing its GPU" in check.message
    fake.faults.clear()
    granted = next(c for c in compute.validate() if c.name == "auto_shutdown")
    assert granted.status == CheckStatus.ok
    fake.nic_reserved_s = 0
    fake.fail("DELETE", r"/microsoft\.devtestlab/schedules/", 403, "AuthorizationFailed", times=5)
    assert compute.release(REF, []).done  # a schedule that cannot be deleted never blocks a release
