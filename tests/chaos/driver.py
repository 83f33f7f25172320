"""The chaos driver: many runs through the real queue handlers, timers and Azurite queues and
tables, on a simulated clock, with faults everywhere.

What it injects (every decision from the seeded schedule in tests/chaos/schedule.py, so a
run is repeatable up to thread scheduling, and the faults the test asserts on happen for every
seed):
- a crash of the handler in every step of every run: before or after the k-th store write
  or provider call of that step (k cycles through 1..MAX_POINT per step, so each point of
  each step is hit; the coverage runs carry k = 1..3 of every step they pass);
- provider faults: an error, throttling, or a permanent error before the call; a timeout
  or a crash after the call succeeded; a new machine invisible to listing for 50 s;
- crashes inside the heartbeat-check and sweeper timers;
- duplicate delivery of a message, one after the other or concurrently in two threads, and
  several different messages handled concurrently (a thread pool).
Messages that fail maxDequeueCount times go to `<queue>-poison` like on the host.

The work is bounded, not timed: a fixed number of runs and of rounds on the simulated clock
(longer only until every forced fault has fired), so a slow machine takes longer but does
the same test.

The agent on each machine follows a script chosen per run (train and succeed, fail, upload
a bad adapter, go silent, never report, lose its machine outside the control plane, or be
cancelled by its user); it calls the agent and run services directly (the HTTP layer adds
only JWT checks, and tokens minted at a simulated future time would not be valid yet).
"""

from __future__ import annotations

import base64
import hashlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import azure.functions as func

from shared.context import invocation
from shared.errors import Conflict, NotFound
from shared.lifecycle import ACTIVE, TERMINAL
from shared.models import AgentComplete, Heartbeat, Role, RunCancel, RunCreate, RunLaunch, RunRecord, RunState
from shared.queues import Queue, decode, get_queues
from shared.security import Principal
from shared.settings import get_settings
from shared.store.repo import Store, get_store, set_store
from tests.chaos.provider import ChaosCloud, Crash
from tests.chaos.schedule import FAULT_WINDOW, MAX_DEQUEUE, MODE_WINDOW, OneHostSchedule
from tests.harness import Harness, lift_quotas, smoke_adapter_zip


def run_body(project: tuple[str, str]) -> RunCreate:
    return RunCreate(project_id=project[0], dataset_version_id=project[1], provider="memory", offer_id="mem-a10",
                     base_model="tensorant/smoke-tiny", price_limit_per_hour=100.0, runtime_limit_s=3 * 3600)


class Faults:
    """Every fault decision, from the schedule. Crash points are counted per delivery (thread-local)."""

    def __init__(self, plan: OneHostSchedule) -> None:
        self.schedule = plan
        self.local = threading.local()
        self.on = True
        self.plan: dict[tuple[str, str], tuple[int, str]] = {}  # (step, run id or "*") -> (k, before|after)
        self.fired = Counter[tuple[str, int, str]]()
        self.fired_ops = Counter[str]()
        self.provider = Counter[str]()
        self.max_ops = Counter[str]()
        self.stubborn: dict[str, int] = {}  # run id -> release calls left that crash
        self.shielded: set[str] = set()  # the coverage runs: no provider fault changes their course
        self.calls = 0  # provider calls that may fail, so far: the schedule's fault counter
        self.lock = threading.Lock()

    @contextmanager
    def delivery(self, step: str, run_id: str) -> Iterator[None]:
        self.local.step, self.local.run_id, self.local.n = step, run_id, 0
        try:
            yield
        finally:
            with self.lock:
                self.max_ops[step] = max(self.max_ops[step], self.local.n)
            self.local.step = None

    def _take(self, when: str, op: str) -> bool:
        step = getattr(self.local, "step", None)
        if step is None or not self.on:
            return False
        with self.lock:
            for key in ((step, self.local.run_id), (step, "*")):
                if self.plan.get(key) == (self.local.n, when):
                    del self.plan[key]
                    self.fired[(step, self.local.n, when)] += 1
                    self.fired_ops[op] += 1
                    return True
        return False

    def before(self, op: str) -> None:
        if getattr(self.local, "step", None) is not None:
            self.local.n += 1
        if self._take("before", op):
            raise Crash(f"{self.local.step}: crash before {op} (point {self.local.n})")

    def after(self, op: str) -> None:
        if self._take("after", op):
            raise Crash(f"{self.local.step}: crash after {op} (point {self.local.n})")

    def pick(self, method: str, run_id: str) -> str | None:
        """The provider's fault callback: planned crashes first, then the schedule's faults."""
        self.before(f"provider.{method}")
        if self._take("after", f"provider.{method}"):
            return "crash_after"
        if not self.on or getattr(self.local, "step", None) is None:
            return None
        with self.lock:
            if method == "release" and self.stubborn.get(run_id, 0) > 0:
                self.stubborn[run_id] -= 1
                self.provider["stubborn release crash"] += 1
                return "crash"
            if run_id in self.shielded:
                return None
            kind = self.schedule.fault(self.calls)
            self.calls += 1
            if kind:
                self.provider[kind] += 1
        return kind


class CrashingStore(Store):
    """The real table store; every write can crash the handler just before or just after it."""

    faults: Faults

    def __init__(self, connection_string: str, prefix: str) -> None:
        super().__init__(connection_string, prefix)
        # The repositories' writes, under the names the crash reports give them.
        for repo, method, name in ((self.runs, "put", "put_run"), (self.runs, "create", "create_run"),
                                   (self.events, "add", "add_event"), (self.ledger, "record", "record_resource"),
                                   (self.audit, "add", "audit")):
            setattr(repo, method, self._crashing(name, getattr(repo, method)))

    def _crashing(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def write(*a: Any, **kw: Any) -> Any:
            self.faults.before(f"store.{name}")
            out = fn(*a, **kw)
            self.faults.after(f"store.{name}")
            return out

        return write


@dataclass
class Agent:
    run_id: str
    script: str
    step: int = 0
    done: bool = False


class Agents:
    """The agents on the machines, one script per run, acting through the agent and run
    services (what the HTTP layer adds is JWT checks). Shared by both chaos variants."""

    def __init__(self, cloud: ChaosCloud, principal: Principal, rng: random.Random) -> None:
        self.cloud, self.principal, self.rng = cloud, principal, rng
        self.by_run: dict[str, Agent] = {}
        self.good = smoke_adapter_zip()
        self.bad = smoke_adapter_zip(base_model="meta-llama/Llama-3.2-1B")

    def add(self, run_id: str, script: str) -> None:
        self.by_run[run_id] = Agent(run_id, script)

    def running(self) -> set[str]:
        """The runs whose machine is running (an agent acts only on a running machine)."""
        with self.cloud.lock:
            return {m.tags.get("tensorant:run", "") for m in self.cloud.machines.values() if m.state == "running"}

    def act(self, runs: list[RunRecord]) -> None:
        from shared.org_storage.base import adapter_key
        from shared.runs.org_backends import storage_for
        from shared.services.api import agent as agent_api
        from shared.services.api.runs import actions as run_api

        ctx = invocation()  # the store the driver set (its crashing store), or the host process's
        running = self.running()
        for run in runs:
            a = self.by_run.get(run.id)
            if a is None or a.done or run.state not in ACTIVE or run.id not in running:
                continue
            if self.rng.random() < 0.3:
                continue  # agents are not in lockstep
            try:
                if a.script == "mute":
                    a.done = True
                elif a.step == 0:
                    agent_api.heartbeat(ctx, run.org, run.id, Heartbeat(phase="preparing", logs=["pulling image"]))
                elif a.step == 1:
                    agent_api.heartbeat(ctx, run.org, run.id, Heartbeat(phase="training", progress=0.5))
                elif a.script in ("ok", "bad"):
                    data = self.good if a.script == "ok" else self.bad
                    storage_for(ctx, run.org).put(adapter_key(run.id), data)
                    agent_api.complete(ctx, run.org, run.id, AgentComplete(
                        status="ok", sha256=hashlib.sha256(data).hexdigest(), size=len(data)))
                    a.done = True
                elif a.script == "fail":
                    agent_api.complete(ctx, run.org, run.id, AgentComplete(status="failed", reason="OOM", exit_code=137))
                    a.done = True
                elif a.script == "silent":
                    a.done = True
                elif a.script == "vanish":
                    with self.cloud.lock:  # deleted in the cloud console
                        for m in self.cloud.machines.values():
                            if m.tags.get("tensorant:run") == run.id:
                                m.state, m.disk_exists = "terminated", False
                    a.done = True
                elif a.script == "cancel":
                    run_api.cancel(ctx, self.principal, run.id, RunCancel(discard=True))
                    a.done = True
                a.step += 1
            except (Conflict, NotFound):
                a.done = True  # the run moved on under the agent


@dataclass
class Stats:
    deliveries: int = 0
    duplicates_sequential: int = 0
    duplicates_concurrent: int = 0
    failed_deliveries: int = 0
    poisoned: int = 0
    replayed: int = 0
    timer_crashes: int = 0
    rounds: int = 0
    scripts: Counter[str] = field(default_factory=Counter)


class Chaos:
    def __init__(self, harness: Harness, cloud: ChaosCloud, *, seed: int, runs: int, workers: int = 4) -> None:
        self.h, self.cloud = harness, cloud
        self.schedule = OneHostSchedule(seed, runs)
        self.faults = Faults(self.schedule)
        self.forced: list[tuple[str, str]] = []  # (step, run id) of the coverage runs' crash points
        self.messages = 0  # messages received so far: the schedule's delivery counter
        self.ticks = Counter[str]()
        self.stats = Stats()
        self.stats_lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.principal = Principal("member@a", harness.org, Role.member)
        self.agents = Agents(cloud, self.principal, random.Random(seed + 2))
        s = get_settings()
        store = CrashingStore(s.storage_connection, s.table_prefix)
        store.faults = self.faults
        set_store(store)
        cloud.pick = self.faults.pick
        cloud.invisible_s = 50.0  # under the launch settle period (launch_settle_s(), 160 s), over one round (30 s)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        set_store(None)

    # ------------------------------------------------------------ runs and agents
    def create_runs(self, project: tuple[str, str]) -> None:
        from shared.services.api.runs import actions, drafts

        lift_quotas(self.principal.org)
        ctx = invocation()
        # Each run crashes once in every step it goes through, at the schedule's point.
        for plan in self.schedule.runs:
            run_id = drafts.create(ctx, self.principal, run_body(project)).id
            for step, point in plan.crash.items():
                self.faults.plan[(step, run_id)] = point
                if plan.covers:
                    self.forced.append((step, run_id))
            if plan.covers:
                self.faults.shielded.add(run_id)
            if plan.stubborn:
                self.faults.stubborn[run_id] = MAX_DEQUEUE + 2
            self.agents.add(run_id, plan.script)
            self.stats.scripts[plan.script] += 1
            actions.launch(ctx, self.principal, run_id, RunLaunch(confirm=True))

    def forced_left(self) -> list[str]:
        """What the schedule forces that has not happened yet: the coverage runs' crash points,
        and the provider calls and messages that hold forced faults."""
        with self.faults.lock:
            left = [f"crash point of {step} for {run_id}" for step, run_id in self.forced
                    if (step, run_id) in self.faults.plan]
            if self.faults.calls < FAULT_WINDOW:
                left.append(f"provider calls that may fail: {self.faults.calls} of {FAULT_WINDOW}")
        if self.messages < MODE_WINDOW:
            left.append(f"messages: {self.messages} of {MODE_WINDOW}")
        return left

    # ------------------------------------------------------------ queues
    def receive(self) -> list[tuple[Queue, Any, Any]]:
        out = []
        q = get_queues()
        for queue in Queue:
            client = q.client(queue.value)
            # Invisible for longer than any round takes, however loaded the machine: a message
            # is handled by the round that took it, never taken back by its visibility ending.
            for m in client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=300):
                out.append((queue, client, m))
        return out

    def deliver_round(self) -> int:
        msgs = self.receive()
        modes = [self.schedule.mode(self.messages + i) for i in range(len(msgs))]
        self.messages += len(msgs)
        list(self.pool.map(lambda args: self._handle(*args), [(*m, mode) for m, mode in zip(msgs, modes, strict=True)]))
        return len(msgs)

    def _invoke(self, queue: Queue, m: Any) -> bool:
        body = base64.b64decode(m.content)
        run_id = str(decode(m.content).get("run_id", ""))
        fn = self.h.queue_fns[queue.value]
        with self.faults.delivery(queue.value, run_id):
            try:
                fn(func.QueueMessage(id=m.id, body=body, pop_receipt=m.pop_receipt))
                return True
            except Exception:
                return False

    def _count(self, **deltas: int) -> None:
        with self.stats_lock:
            for name, d in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + d)

    def _handle(self, queue: Queue, client: Any, m: Any, mode: str) -> None:
        if mode == "concurrent":
            results: list[bool] = []
            other = threading.Thread(target=lambda: results.append(self._invoke(queue, m)))
            other.start()
            ok = self._invoke(queue, m)
            other.join()
            ok = ok or any(results)
            self._count(deliveries=2, duplicates_concurrent=1)
        elif mode == "twice":
            ok = self._invoke(queue, m)
            ok = self._invoke(queue, m) or ok
            self._count(deliveries=2, duplicates_sequential=1)
        else:
            ok = self._invoke(queue, m)
            self._count(deliveries=1)
        if ok:  # any delivery that succeeded deletes the message, as on the host
            client.delete_message(m.id, m.pop_receipt)
            return
        self._count(failed_deliveries=1)
        if m.dequeue_count >= MAX_DEQUEUE:  # what the host does after maxDequeueCount
            get_queues().client(queue.poison).send_message(m.content)
            client.delete_message(m.id, m.pop_receipt)
            self._count(poisoned=1)
        else:
            client.update_message(m.id, m.pop_receipt, visibility_timeout=0)

    # ------------------------------------------------------------ timers
    def tick(self, name: str) -> None:
        crash = self.schedule.timer_crash(name, self.ticks[name])
        self.ticks[name] += 1
        if self.faults.on and crash:
            self.faults.plan[(name, "*")] = crash
        with self.faults.delivery(name, "*"):
            try:
                self.h.tick(name)
            except Exception:
                self.stats.timer_crashes += 1
        self.faults.plan.pop((name, "*"), None)

    # ------------------------------------------------------------ phases
    def runs(self) -> list[RunRecord]:
        return get_store().runs.in_org(self.h.org)

    def chaos_phase(self, rounds: int, step_s: float, max_rounds: int) -> None:
        """`rounds` rounds of step_s simulated seconds, and more (up to max_rounds) until every
        forced fault has happened: the faults stay on until then."""
        for i in range(max_rounds):
            if i >= rounds and not self.forced_left():
                return
            self.stats.rounds += 1
            self.h.clock.advance(step_s)
            self.agents.act(self.runs())
            self.deliver_round()
            self.tick("heartbeat_check")
            if i % 4 == 3:
                self.tick("sweeper")

    def settle_phase(self, max_iterations: int = 80) -> int:
        """Faults off, agents stopped: replay the poison queues, then let deadlines, retries and
        the sweeper bring every run to rest. Returns the iterations it took."""
        self.faults.on = False
        self.faults.plan.clear()
        self.replay_poison()
        grace = get_settings().sweep_grace_s
        quiet = 0
        for it in range(max_iterations):
            self.h.clock.advance(120)
            self.tick("heartbeat_check")
            for _ in range(6):
                if not self.deliver_round():
                    break
            if it % 3 == 2:
                self.tick("sweeper")
            self.replay_poison()
            resting = all(r.state in TERMINAL or r.state == RunState.retained for r in self.runs())
            quiet = quiet + 1 if resting and not self.pending() else 0
            if quiet * 120 > grace + 240:  # resting for longer than the grace period plus two sweeps
                return it + 1
        return max_iterations

    def pending(self) -> int:
        q = get_queues()
        return sum(q.length(x.value) + q.length(x.poison) for x in Queue)

    def replay_poison(self) -> None:
        for q in Queue:
            out = self.h.ok("POST", f"/api/platform/queues/{q.value}/poison/replay", token="admin", json_body={})
            self.stats.replayed += len(out["replayed"])


def assert_at_rest(runs: dict[str, RunRecord], cloud: ChaosCloud) -> None:
    """The chaos invariants: every run terminal or retained; no run ever had two machines;
    nothing bills without a live run; every retained run keeps its (stopped) machine's disk;
    every other run's machines and disks are gone, with no release error left."""
    stuck = {r.id: r.state.value for r in runs.values() if r.state not in TERMINAL and r.state != RunState.retained}
    assert not stuck, f"runs not at rest: {stuck}"
    with cloud.lock:
        created, machines, live = dict(cloud.created), list(cloud.machines.values()), cloud.live()
    twice = {run: n for run, n in created.items() if n > 1}
    assert not twice, f"runs that had two machines: {twice}"
    for m in live:
        run = runs.get(m.tags.get("tensorant:run", ""))
        assert run is not None and run.state == RunState.retained, \
            f"machine {m.id} ({m.state}) bills without a live run: {run and run.state.value}"
    for run in runs.values():
        mine = [m for m in machines if m.tags.get("tensorant:run") == run.id]
        if run.state == RunState.retained:
            assert [(m.state, m.disk_exists) for m in mine] == [("stopped", True)], \
                f"retained run {run.id} lost its disk or keeps computing: {run.reason}"
        else:
            assert all(m.state == "terminated" and not m.disk_exists for m in mine), run.id
            assert not run.release_error, run.release_error


def wall() -> float:
    return time.perf_counter()
