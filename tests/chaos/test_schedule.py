"""The chaos tests' fault schedules alone, without Azurite or hosts: for seeds
1..20, every fault the chaos tests assert on is forced by the schedule (random draws alone
missed some: seed 202 drew no crash at a provider call), and each forced decision is what
the schedule's counters give back, so the driver that asks for it gets it."""

from __future__ import annotations

import pytest

from tests.chaos.schedule import (
    ENDS_IN,
    FAULT_WINDOW,
    MODE_WINDOW,
    ONE_HOST_CONCURRENT,
    ONE_HOST_POINTS_PER_STEP,
    ONE_HOST_PROVIDER_FAULTS,
    ONE_HOST_STATES,
    STEPS,
    TWO_HOST_COVERAGE_SCRIPTS,
    TWO_HOST_CRASHES,
    TWO_HOST_DUPLICATE_SENDS,
    TWO_HOST_ENDS_IN,
    TWO_HOST_FAULTS,
    TWO_HOST_STATES,
    HostSchedule,
    OneHostSchedule,
    two_host_scripts,
)

SEEDS = range(1, 21)
HOSTS = ("host-a", "host-b")  # the names TwoHosts gives them


@pytest.mark.parametrize("seed", SEEDS)
def test_one_host_schedule_forces_what_test_chaos_asserts(seed: int) -> None:
    plan = OneHostSchedule(seed, runs=60)
    points = plan.forced_points()
    for step in STEPS:  # every step: crash points at several k, before and after
        assert len({k for k, _ in points[step]}) >= ONE_HOST_POINTS_PER_STEP, (step, points[step])
        assert {when for _, when in points[step]} == {"before", "after"}, (step, points[step])
        assert all(k <= ONE_HOST_POINTS_PER_STEP for k, _ in points[step])  # reached by every full delivery
    assert plan.forced_states() >= ONE_HOST_STATES
    coverage = [p for p in plan.runs if p.covers]
    assert coverage and all(p.script in ENDS_IN and not p.stubborn for p in coverage)
    assert sum(1 for call in range(FAULT_WINDOW) if plan.fault(call)) >= ONE_HOST_PROVIDER_FAULTS
    assert sum(plan.mode(m) == "concurrent" for m in range(MODE_WINDOW)) >= ONE_HOST_CONCURRENT
    # A pure function of the seed: the driver asking again (another thread, a rerun) gets the same.
    again = OneHostSchedule(seed, runs=60)
    assert again.runs == plan.runs and [again.fault(c) for c in range(300)] == [plan.fault(c) for c in range(300)]


@pytest.mark.parametrize("seed", SEEDS)
def test_two_host_schedule_forces_what_test_two_hosts_asserts(seed: int) -> None:
    plans = [HostSchedule(seed, name) for name in HOSTS]
    faults = duplicates = 0
    for plan in plans:
        needs = plan.needs()
        # Each host dies before and after a store write and a provider call, at its forced counts.
        crashes = {(op, plan.crash(op, n)) for op in ("store", "provider") for n in range(1, needs[op] + 1)}
        assert crashes >= TWO_HOST_CRASHES, (plan.host, crashes)
        assert plan.forced_crashes() == TWO_HOST_CRASHES
        faults += sum(1 for n in range(1, needs["fault"] + 1) if plan.fault(n))
        duplicates += sum(plan.duplicate(n) for n in range(1, needs["delivery"] + 1))
        # Forced within the first operations: reached in the chaos rounds of 60 runs (a host makes
        # about 300 store writes and 80 provider calls).
        assert needs["store"] < 120 and max(needs["provider"], needs["fault"], needs["delivery"]) < 40, needs
    assert faults >= TWO_HOST_FAULTS and duplicates >= TWO_HOST_DUPLICATE_SENDS
    assert plans[0].crashes != plans[1].crashes or plans[0].faults != plans[1].faults  # two hosts, two schedules
    scripts = two_host_scripts(seed, 60)
    assert len(scripts) == 60 and tuple(scripts[:len(TWO_HOST_COVERAGE_SCRIPTS)]) == TWO_HOST_COVERAGE_SCRIPTS
    assert {TWO_HOST_ENDS_IN[s] for s in TWO_HOST_COVERAGE_SCRIPTS} >= TWO_HOST_STATES
