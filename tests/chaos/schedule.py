"""The chaos tests' fault schedules: every fault decision is a pure function of the seed and
of a counter (the run's number, the n-th message, the n-th provider call), and the faults the
tests assert on are forced, so every seed has them (random draws alone
missed some).

Drawn at random only, coverage was left to chance: seed 202 drew no crash at a provider call in
the two-host test, and a loaded machine did less in the wall seconds the test gave it. Here:
- the faults each assertion needs are placed at deterministic points early in the run (the
  first runs, the n-th message or provider call of a low n), which the test reaches for
  certain, and the driver keeps the faults on until every forced one has fired;
- everything else is drawn as before, per counter value (`_draw`), so which call gets which
  fault does not depend on how many draws other threads or processes made first.
tests/chaos/test_schedule.py checks the forced coverage of seeds 1..20 of both schedules
without running anything; the chaos tests check that it happened.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tests.support.steps import RUN_STEPS

STEPS = tuple(step.value for step in RUN_STEPS)  # the step table's run steps
MAX_POINT = 8  # crash points per step: the k-th store write or provider call, k = 1..MAX_POINT
WHEN = ("before", "after")
SCRIPTS = {"ok": 50, "fail": 10, "bad": 6, "silent": 8, "vanish": 8, "cancel": 10, "mute": 8}
PROVIDER_FAULTS = {"error": 3, "throttle": 3, "timeout": 2, "crash_after": 2, "permanent": 1, "permanent_after": 1}
MAX_DEQUEUE = 5
STUBBORN_SHARE = 0.05  # runs whose release crashes more than maxDequeueCount times (poison, then replay)


def _draw(seed: int, *key: object) -> random.Random:
    """A generator for one decision: the same seed and key give the same draw, whatever was
    drawn before (threads and processes count calls in their own order)."""
    return random.Random(":".join(str(k) for k in (seed, *key)))


def _fault_kind(rng: random.Random, kinds: dict[str, int]) -> str:
    return rng.choices(list(kinds), weights=list(kinds.values()))[0]


# ---------------------------------------------------------------- one host (test_chaos.py)

# What test_chaos.py asserts on, and what the schedule forces for it.
ONE_HOST_POINTS_PER_STEP = 3  # distinct k among the crash points that fired, per step (both before and after)
ONE_HOST_PROVIDER_FAULTS = 20
ONE_HOST_CONCURRENT = 10  # messages delivered twice at the same moment
ONE_HOST_STATES = frozenset({"succeeded", "retained", "failed", "cancelled"})

# The coverage runs, the first ones created: their scripts end in each final state asserted
# on, no provider fault changes their course (a permanent launch error would end an "ok" run
# as failed), and between them they carry the crash points k = 1..3, before and after, of
# every step they pass (every full delivery of a step makes at least 3 store writes and
# provider calls). A crash only delays a run; it never changes where the run ends.
COVERAGE_SCRIPTS = ("ok",) * 6 + ("silent",) * 6 + ("mute", "cancel")
ENDS_IN = {"ok": "succeeded", "silent": "retained", "mute": "failed", "cancel": "cancelled"}
PASSES = {"ok": ("launch", "verify-adapter", "release"), "silent": ("launch", "retain"),
          "mute": ("launch", "release"), "cancel": ("launch", "release")}
FORCED_POINTS = tuple((k, when) for k in (1, 2, 3) for when in WHEN)
# Provider faults: FORCED_FAULTS among the first FAULT_WINDOW calls that may fail (calls of
# the other runs, and of the timers), drawn at `fault_rate` after that. The chaos phase makes
# several hundred such calls.
FORCED_FAULTS, FAULT_WINDOW = 24, 80
# Messages delivered twice at once: FORCED_CONCURRENT among the first MODE_WINDOW messages.
FORCED_CONCURRENT, MODE_WINDOW = 12, 120
MODES = {"once": 80, "twice": 10, "concurrent": 10}
TIMER_CRASH_RATE = 0.15


@dataclass(frozen=True)
class RunPlan:
    script: str
    crash: dict[str, tuple[int, str]]  # step -> (k, before|after): the crash of its first delivery to reach it
    covers: bool  # a coverage run: no random provider fault, never stubborn
    stubborn: bool  # its release crashes more than maxDequeueCount times


class OneHostSchedule:
    """The one-host test's runs (script, crash point per step) and faults, by counter."""

    def __init__(self, seed: int, runs: int, fault_rate: float = 0.08) -> None:
        # The coverage runs, then enough others to go through each step's cycle of points once.
        if runs < len(COVERAGE_SCRIPTS) + 2 * MAX_POINT:
            raise ValueError(f"the schedule needs at least {len(COVERAGE_SCRIPTS) + 2 * MAX_POINT} runs")
        self.seed, self.fault_rate = seed, fault_rate
        rng = random.Random(seed)
        # The other runs cycle through every point k = 1..MAX_POINT x before/after of every step.
        cycles = {step: [(k, when) for k in range(1, MAX_POINT + 1) for when in WHEN] for step in STEPS}
        forced = {step: list(FORCED_POINTS) for step in STEPS}
        for step in STEPS:
            rng.shuffle(cycles[step])
            rng.shuffle(forced[step])
        self.runs: list[RunPlan] = []
        passed = {step: 0 for step in STEPS}  # coverage runs so far that pass the step
        for script in COVERAGE_SCRIPTS:
            crash = {}
            for step in PASSES[script]:
                crash[step] = forced[step][passed[step] % len(FORCED_POINTS)]
                passed[step] += 1
            self.runs.append(RunPlan(script, crash, covers=True, stubborn=False))
        for i in range(len(COVERAGE_SCRIPTS), runs):
            script = rng.choices(list(SCRIPTS), weights=list(SCRIPTS.values()))[0]
            crash = {step: cycle[i % len(cycle)] for step, cycle in cycles.items()}
            self.runs.append(RunPlan(script, crash, covers=False, stubborn=rng.random() < STUBBORN_SHARE))
        self.forced_faults = {i: _fault_kind(rng, PROVIDER_FAULTS)
                              for i in sorted(rng.sample(range(FAULT_WINDOW), FORCED_FAULTS))}
        self.forced_concurrent = frozenset(rng.sample(range(MODE_WINDOW), FORCED_CONCURRENT))

    def fault(self, call: int) -> str | None:
        """The fault of the `call`-th provider call that may fail (from 0), or None."""
        if call in self.forced_faults:
            return self.forced_faults[call]
        if call < FAULT_WINDOW:
            return None
        rng = _draw(self.seed, "fault", call)
        return _fault_kind(rng, PROVIDER_FAULTS) if rng.random() < self.fault_rate else None

    def mode(self, message: int) -> str:
        """How the `message`-th message received (from 0) is delivered: once, twice, or twice at once."""
        if message in self.forced_concurrent:
            return "concurrent"
        if message < MODE_WINDOW:
            return "once"
        return _fault_kind(_draw(self.seed, "mode", message), MODES)

    def timer_crash(self, name: str, tick: int) -> tuple[int, str] | None:
        """The crash point of the `tick`-th tick of a timer, or None."""
        rng = _draw(self.seed, "timer", name, tick)
        return (rng.randint(1, 4), rng.choice(WHEN)) if rng.random() < TIMER_CRASH_RATE else None

    # What the schedule guarantees (tests/chaos/test_schedule.py checks it for many seeds).
    def forced_points(self) -> dict[str, set[tuple[int, str]]]:
        out: dict[str, set[tuple[int, str]]] = {step: set() for step in STEPS}
        for plan in self.runs:
            if plan.covers:
                for step, point in plan.crash.items():
                    out[step].add(point)
        return out

    def forced_states(self) -> set[str]:
        return {ENDS_IN[plan.script] for plan in self.runs if plan.covers}


# ---------------------------------------------------------------- two hosts (test_two_hosts.py)

TWO_HOST_FAULTS = 5  # provider faults, both hosts together
TWO_HOST_DUPLICATE_SENDS = 5
TWO_HOST_CRASHES = frozenset((op, when) for op in ("store", "provider") for when in WHEN)  # per host
TWO_HOST_COVERAGE_SCRIPTS = ("ok", "ok", "ok", "silent", "silent", "fail")
TWO_HOST_STATES = frozenset({"succeeded", "retained"})
TWO_HOST_ENDS_IN = {"ok": "succeeded", "silent": "retained", "fail": "retained"}


@dataclass(frozen=True)
class HostRates:
    store_crash: float = 0.005  # per store write: the process dies just before or just after it
    provider_crash: float = 0.01  # per provider call: dies before it, or after it succeeded
    fault: float = 0.15  # per provider call of a run that may fail: an injected provider error
    duplicate: float = 0.05  # per delivery: a copy sent first; per success: delivered again


class HostSchedule:
    """One host's faults, by its counters (kept in a file across the host's restarts, so the
    n-th store write is the host's n-th, whichever of its processes makes it):
    - store: every store write in a step or timer (a crash just before or just after it);
    - provider: every provider call in a step or timer (a crash before it, or after it succeeded);
    - fault: every provider call that did not crash and whose run may fail (an injected error);
    - delivery: every message delivered (a duplicate sent first; delivered again after success).
    Forced: each host dies at least once before and after a store write and a provider call,
    and injects FORCED faults and duplicate sends, all within its first operations (a host
    makes hundreds of store writes and dozens of provider calls in the chaos rounds)."""

    FORCED = 3  # faults and duplicate sends forced per host

    def __init__(self, seed: int, host: str, rates: HostRates = HostRates()) -> None:
        self.seed, self.host, self.rates = seed, host, rates
        rng = random.Random(f"{seed}:{host}")
        # One early and one later (which is before and which after: drawn), so that the host's
        # spare process is ready again when the next forced crash comes (two_hosts.py).
        store_when, provider_when = rng.sample(WHEN, 2), rng.sample(WHEN, 2)
        self.crashes: dict[tuple[str, int], str] = {
            ("store", rng.randrange(3, 30)): store_when[0], ("store", rng.randrange(60, 120)): store_when[1],
            ("provider", rng.randrange(2, 12)): provider_when[0], ("provider", rng.randrange(20, 40)): provider_when[1]}
        kinds = {k: w for k, w in PROVIDER_FAULTS.items() if k != "crash_after"}  # crashes are real here
        self.faults = {i: _fault_kind(rng, kinds) for i in rng.sample(range(1, 25), self.FORCED)}
        self.duplicates = frozenset(rng.sample(range(1, 25), self.FORCED))
        self.fault_kinds = kinds
        self.timer_offsets = {"heartbeat_check": rng.random(), "sweeper": rng.random()}  # share of a period

    def crash(self, op: str, n: int) -> str | None:
        """Whether the host dies at its n-th `op` (store|provider), from 1: before, after, or None."""
        if (op, n) in self.crashes:
            return self.crashes[(op, n)]
        rate = self.rates.store_crash if op == "store" else self.rates.provider_crash
        rng = _draw(self.seed, self.host, op, n)
        return rng.choice(WHEN) if rng.random() < rate else None

    def fault(self, n: int) -> str | None:
        if n in self.faults:
            return self.faults[n]
        rng = _draw(self.seed, self.host, "fault", n)
        return _fault_kind(rng, self.fault_kinds) if rng.random() < self.rates.fault else None

    def duplicate(self, n: int) -> bool:
        return n in self.duplicates or _draw(self.seed, self.host, "duplicate", n).random() < self.rates.duplicate

    def redeliver(self, n: int) -> bool:
        return _draw(self.seed, self.host, "redeliver", n).random() < self.rates.duplicate

    def needs(self) -> dict[str, int]:
        """The counter values past which every forced fault of this host has fired."""
        out = {"store": 0, "provider": 0, "fault": max(self.faults), "delivery": max(self.duplicates)}
        for op, n in self.crashes:
            out[op] = max(out[op], n)
        return out

    def forced_crashes(self) -> set[tuple[str, str]]:
        return {(op, when) for (op, _), when in self.crashes.items()}


def two_host_scripts(seed: int, runs: int) -> list[str]:
    """The scripts of the two-host test's runs: the coverage runs first (they end succeeded
    and retained: no provider fault changes their course), then drawn."""
    rng = random.Random(seed)
    drawn = rng.choices(list(SCRIPTS), weights=list(SCRIPTS.values()), k=runs - len(TWO_HOST_COVERAGE_SCRIPTS))
    return list(TWO_HOST_COVERAGE_SCRIPTS) + drawn
