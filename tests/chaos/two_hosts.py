"""The two-host chaos driver: two Functions host processes (tests/chaos/host.py)
on one Azurite and one shared file cloud, crashing for real and restarted by a supervisor,
while this process plays the API users and the agents on the machines.

Time is simulated, shared and moved by this driver in rounds: it advances the
shared clock by a step, lets the agents act, then starts a round and waits until both hosts
have run it (a host that dies in a round is restarted and runs it again). So the test does
the same work per simulated second on any machine, however loaded; only its wall time grows.

Phases: the runs are created and launched (the clock stands still), then chaos rounds: at
least a given number, and more until each host's forced faults have happened (its counters
are past its schedule's forced points); then everything calms down (the hosts stop
injecting, the agents stop), the poison queues are replayed, and rounds go on until every
run is at rest with no message left for longer than the sweeper needs to find a leak.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shared.context import invocation
from shared.lifecycle import TERMINAL
from shared.models import Role, RunLaunch, RunRecord, RunState
from shared.queues import Queue, get_queues
from shared.security import Principal
from shared.store import get_store
from tests.chaos.driver import Agents, run_body
from tests.chaos.file_cloud import FileCloud
from tests.chaos.host import CONFIG_ENV, CRASH_EXIT, SHIELDED_FILE, HostConfig, SharedClock, read_int, write_atomically
from tests.chaos.schedule import TWO_HOST_COVERAGE_SCRIPTS, HostSchedule, two_host_scripts
from tests.harness import lift_quotas

# A round that does not finish in this many wall seconds means a host hangs: a guard against
# a stuck test, not a budget (a round takes well under a second, a restart a few seconds).
ROUND_HANG_S = 180.0


@dataclass
class Supervision:
    starts: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # exits that were not injected crashes
    given_back: int = 0  # messages a dead host held, made visible again


class TwoHosts:
    def __init__(self, workdir: Path, cloud: FileCloud, clock: SharedClock, project: tuple[str, str], org: str, *,
                 runs: int, seed: int, config: HostConfig, hosts: tuple[str, ...] = ("host-a", "host-b")) -> None:
        self.workdir, self.cloud, self.clock, self.project, self.org = workdir, cloud, clock, project, org
        self.n_runs, self.seed, self.config, self.names = runs, seed, config, hosts
        self.schedules = {name: HostSchedule(seed, name) for name in hosts}
        self.principal = Principal("member@a", org, Role.member)
        self.admin = Principal("admin@platform", org, Role.admin)
        self.agents = Agents(cloud, self.principal, random.Random(seed + 2))
        self.scripts = Counter[str]()
        self.shielded: list[str] = []
        self.sup = Supervision()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.spares: dict[str, tuple[subprocess.Popen[bytes], str]] = {}  # host -> (process, its go token)
        self.procs_lock = threading.Lock()
        self.stopping = threading.Event()
        self.agents_on = False
        self.rounds = 0
        self.round_s: list[float] = []  # wall seconds of each round (the report)
        self.replayed = 0
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ hosts
    def _spawn(self, name: str, spare: str = "") -> subprocess.Popen[bytes]:
        cfg = replace(self.config, name=name, spare=spare)
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        p = subprocess.Popen([sys.executable, "-m", "tests.chaos.host"], stdout=log, stderr=log,
                             env={**os.environ, CONFIG_ENV: cfg.to_env()})
        log.close()
        return p

    def _start(self, name: str) -> None:
        """Start the host: its spare takes over (ready, or nearly), and a new spare starts."""
        spare = self.spares.pop(name, None)
        if spare is None:
            self.procs[name] = self._spawn(name)
        else:
            (self.workdir / f"go-{spare[1]}").touch()
            self.procs[name] = spare[0]
        self.sup.starts[name] += 1
        token = f"{name}-{self.sup.starts[name]}"
        self.spares[name] = (self._spawn(name, spare=token), token)

    def _supervise(self) -> None:
        while not self.stopping.is_set():
            with self.procs_lock:
                for name, p in list(self.procs.items()):
                    rc = p.poll()
                    if rc is None:
                        continue
                    if rc == CRASH_EXIT:
                        self.sup.crashes[name] += 1
                    else:
                        self.sup.failures.append(f"{name} exited {rc}: {self.log_tail(name)}")
                    self._give_back(name)
                    if not self.stopping.is_set():
                        self._start(name)
            time.sleep(0.02)

    def _give_back(self, name: str) -> None:
        """The messages a dead host held come back when their visibility ends; here at once
        (simulated time: the lease ended), so the test waits for no wall-clock timeout."""
        from azure.core.exceptions import AzureError

        try:
            held = json.loads((self.workdir / f"held-{name}.json").read_text())
        except FileNotFoundError:
            return
        q = get_queues()
        for queue, message_id, receipt in held:
            try:
                q.client(queue).update_message(message_id, receipt, visibility_timeout=0)
                self.sup.given_back += 1
            except AzureError:
                pass  # deleted or given back by the host itself before it died

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join((self.workdir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def warm_up(self) -> None:
        """Start a spare of each host, to import and connect while the runs are created."""
        for name in self.names:
            token = f"{name}-0"
            self.spares[name] = (self._spawn(name, spare=token), token)

    def start(self) -> None:
        """The hosts take over (after create_runs), under supervision."""
        with self.procs_lock:
            for name in self.names:
                self._start(name)
        t = threading.Thread(target=self._supervise, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        if self.stopping.is_set():
            return  # stopped already (the test, then its fixture)
        (self.workdir / "stop").touch()
        self.stopping.set()
        for t in self._threads:
            t.join(timeout=10)
        for p in [*self.procs.values(), *(spare for spare, _ in self.spares.values())]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for name, p in self.procs.items():
            if p.returncode not in (0, CRASH_EXIT):
                self.sup.failures.append(f"{name} exited {p.returncode} at stop: {self.log_tail(name)}")
            elif p.returncode == CRASH_EXIT:
                self.sup.crashes[name] += 1

    # ------------------------------------------------------------ rounds
    def round(self, step_s: float) -> None:
        """Advance the clock by step_s, let the agents act, and have both hosts run one round."""
        prev = self.clock()
        self.clock.advance(step_s)
        if self.agents_on:
            self.agents.act(self.runs())
        self.rounds += 1
        write_atomically(self.workdir / "round", f"{self.rounds} {prev!r}")
        started = time.perf_counter()
        while any(read_int(self.workdir / f"done-{name}") < self.rounds for name in self.names):
            if time.perf_counter() - started > ROUND_HANG_S:
                raise AssertionError(f"round {self.rounds} did not finish in {ROUND_HANG_S:.0f} s: {self.sup}\n"
                                     + "\n".join(self.log_tail(name) for name in self.names))
            time.sleep(0.005)
        self.round_s.append(time.perf_counter() - started)

    def forced_left(self) -> dict[str, dict[str, int]]:
        """Per host, the counters still short of its schedule's forced points."""
        left = {}
        for name, plan in self.schedules.items():
            path = self.workdir / f"tally-{name}.json"
            counts = json.loads(path.read_text()) if path.exists() else {}
            short = {what: n for what, n in plan.needs().items() if counts.get(what, 0) < n}
            if short:
                left[name] = short
        return left

    def chaos(self, *, step_s: float, rounds: int, max_rounds: int) -> int:
        """Chaos rounds: at least `rounds`, and more until every forced fault has happened."""
        self.agents_on = True
        for i in range(max_rounds):
            if i >= rounds and not self.forced_left():
                return i
            self.round(step_s)
        raise AssertionError(f"forced faults not reached in {max_rounds} rounds: {self.forced_left()}")

    def calm(self) -> None:
        """Faults off and agents stopped, as in the one-host chaos test's settle phase."""
        self.agents_on = False
        (self.workdir / "calm").touch()

    # ------------------------------------------------------------ users and agents
    def create_runs(self) -> None:
        from shared.services.api.runs import actions, drafts

        lift_quotas(self.org)
        ctx = invocation()
        for i, script in enumerate(two_host_scripts(self.seed, self.n_runs)):
            run_id = drafts.create(ctx, self.principal, run_body(self.project)).id
            self.agents.add(run_id, script)
            self.scripts[script] += 1
            if i < len(TWO_HOST_COVERAGE_SCRIPTS):
                self.shielded.append(run_id)
            actions.launch(ctx, self.principal, run_id, RunLaunch(confirm=True))
        write_atomically(self.workdir / SHIELDED_FILE, json.dumps(self.shielded))

    # ------------------------------------------------------------ settle
    def runs(self) -> list[RunRecord]:
        return get_store().runs.in_org(self.org)

    def pending(self) -> int:
        q = get_queues()
        return sum(q.length(x.value) + q.length(x.poison) for x in Queue)

    def replay_poison(self) -> None:
        from shared.services.api import admin

        ctx = invocation()
        for q in Queue:
            self.replayed += len(admin.replay(ctx, self.admin, q.value, None)["replayed"])

    def settle(self, *, step_s: float, quiet_sim_s: float, max_rounds: int) -> int:
        """Rounds until every run rests and no message is left, for quiet_sim_s simulated
        seconds in a row; returns the rounds it took (raises past max_rounds)."""
        quiet = 0.0
        for i in range(max_rounds):
            self.replay_poison()
            self.round(step_s)
            resting = all(r.state in TERMINAL or r.state == RunState.retained for r in self.runs())
            quiet = quiet + step_s if resting and not self.pending() else 0.0
            if quiet >= quiet_sim_s:
                return i + 1
        states = Counter(r.state.value for r in self.runs())
        raise AssertionError(f"not at rest after {max_rounds} rounds: {dict(states)}, {self.pending()} messages; "
                             f"hosts: {self.sup}")

    # ------------------------------------------------------------ report
    def events(self) -> list[dict[str, Any]]:
        path = self.workdir / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
