"""The two-host chaos driver (issue 12.11): two Functions host processes (tests/chaos/host.py)
on one Azurite and one shared file cloud, crashing for real and restarted by a supervisor,
while this process plays the API users and the agents on the machines.

Time is simulated and shared: every process runs a SpeedClock with the same start, so
"ask again in 60 s" (a queue delay scaled by 1/speed) and the deadlines agree everywhere.

Phases: runs are created and launched while both hosts run and crash; after `chaos_s` wall
seconds everything calms down (the hosts stop injecting, the agents stop), the poison queues
are replayed, and the driver waits until every run is at rest with no message left for
longer than the sweeper's grace period plus two sweeps.
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

from shared.models import Role, RunLaunch, RunRecord, RunState
from shared.queues import Queue, get_queues
from shared.runs.lifecycle import TERMINAL
from shared.security import Principal
from shared.store import get_store
from tests.chaos.driver import Agents, pick_script, run_body
from tests.chaos.file_cloud import FileCloud
from tests.chaos.host import CONFIG_ENV, CRASH_EXIT, HostConfig
from tests.harness import lift_quotas


@dataclass
class Supervision:
    starts: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # exits that were not injected crashes


class TwoHosts:
    def __init__(self, workdir: Path, cloud: FileCloud, project: tuple[str, str], org: str, *, runs: int, seed: int,
                 config: HostConfig, hosts: tuple[str, ...] = ("host-a", "host-b")) -> None:
        self.workdir, self.cloud, self.project, self.org = workdir, cloud, project, org
        self.n_runs, self.config, self.names = runs, config, hosts
        self.rng = random.Random(seed)
        self.principal = Principal("member@a", org, Role.member)
        self.admin = Principal("admin@platform", org, Role.admin)
        self.agents = Agents(cloud, self.principal, random.Random(seed + 2))
        self.scripts = Counter[str]()
        self.sup = Supervision()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = threading.Event()
        self.agents_on = threading.Event()
        self.replayed = 0
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ hosts
    def _start(self, name: str) -> None:
        n = self.sup.starts[name]
        cfg = replace(self.config, name=name, seed=self.config.seed + 1000 * (list(self.names).index(name) + 1) + n)
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "tests.chaos.host"], stdout=log, stderr=log,
                                            env={**os.environ, CONFIG_ENV: cfg.to_env()})
        log.close()
        self.sup.starts[name] += 1

    def _supervise(self) -> None:
        while not self.stopping.is_set():
            for name, p in list(self.procs.items()):
                rc = p.poll()
                if rc is None:
                    continue
                if rc == CRASH_EXIT:
                    self.sup.crashes[name] += 1
                else:
                    self.sup.failures.append(f"{name} exited {rc}: {self.log_tail(name)}")
                if not self.stopping.is_set():
                    self._start(name)
            time.sleep(0.05)

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join((self.workdir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def start(self) -> None:
        for name in self.names:
            self._start(name)
        for target in (self._supervise, self._act):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        if self.stopping.is_set():
            return  # stopped already (the test, then its fixture)
        (self.workdir / "stop").touch()
        self.stopping.set()
        self.agents_on.clear()
        for t in self._threads:
            t.join(timeout=10)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for name, p in self.procs.items():
            if p.returncode not in (0, CRASH_EXIT):
                self.sup.failures.append(f"{name} exited {p.returncode} at stop: {self.log_tail(name)}")
            elif p.returncode == CRASH_EXIT:
                self.sup.crashes[name] += 1

    # ------------------------------------------------------------ users and agents
    def create_runs(self) -> None:
        from shared.services import runs

        lift_quotas(self.org)
        self.agents_on.set()
        for _ in range(self.n_runs):
            run_id = runs.create(self.principal, run_body(self.project)).id
            script = pick_script(self.rng)
            self.agents.add(run_id, script)
            self.scripts[script] += 1
            runs.launch(self.principal, run_id, RunLaunch(confirm=True))

    def _act(self) -> None:
        while not self.stopping.is_set():
            if self.agents_on.is_set():
                self.agents.act(self.runs())
            time.sleep(0.2)

    def calm(self) -> None:
        """Faults off and agents stopped, as in the one-host chaos test's settle phase."""
        self.agents_on.clear()
        (self.workdir / "calm").touch()

    # ------------------------------------------------------------ settle
    def runs(self) -> list[RunRecord]:
        return get_store().list_runs(self.org)

    def pending(self) -> int:
        q = get_queues()
        return sum(q.length(x.value) + q.length(x.poison) for x in Queue)

    def replay_poison(self) -> None:
        from shared.services import admin

        for q in Queue:
            self.replayed += len(admin.replay(self.admin, q.value, None)["replayed"])

    def settle(self, quiet_sim_s: float, max_wall_s: float) -> float:
        """Waits until every run rests and no message is left, for quiet_sim_s simulated
        seconds in a row; returns the wall seconds it took (raises past max_wall_s)."""
        from shared.clock import now_ts

        started = time.perf_counter()
        quiet_since: float | None = None
        while time.perf_counter() - started < max_wall_s:
            self.replay_poison()
            resting = all(r.state in TERMINAL or r.state == RunState.retained for r in self.runs())
            if resting and not self.pending():
                quiet_since = quiet_since or now_ts()
                if now_ts() - quiet_since >= quiet_sim_s:
                    return time.perf_counter() - started
            else:
                quiet_since = None
            time.sleep(0.3)
        states = Counter(r.state.value for r in self.runs())
        raise AssertionError(f"not at rest after {max_wall_s:.0f} s: {dict(states)}, {self.pending()} messages; "
                             f"hosts: {self.sup}")

    # ------------------------------------------------------------ report
    def events(self) -> list[dict[str, Any]]:
        path = self.workdir / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
