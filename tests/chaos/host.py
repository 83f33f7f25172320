"""One Functions host of the two-host chaos test: `python -m tests.chaos.host`, started (and
restarted after each crash) by tests/chaos/two_hosts.py with its settings in one environment
variable.

It does what an instance of the Functions host does with this app: takes messages from every
step queue on the shared Azurite, runs the queue functions (a few at a time), moves a message
that failed maxDequeueCount times to `<queue>-poison`, and fires the heartbeat-check and
sweeper timers. Unlike the real host, both instances fire the timers (the real ones hold a
singleton lease), which only makes races more likely (each account sweep holds a lease of its own:
of two sweeps at once, one skips).

Time is simulated and moves in rounds, driven by the test (so a loaded machine
changes only the wall time): the test advances the
shared clock (SharedClock: a file every process maps), then starts a round; in a round each
host fires the timers that fell due since the last round, takes one batch of messages from
every queue, runs them, and reports the round done. So the work done per simulated second is
the same on a fast machine and a loaded one (only the wall time differs), and delays ("ask
again in 60 s") are not waited for: a message sent with a delay is taken in the next round,
as in the one-host test.

Until the test makes things calm (a file appears), it also misbehaves, as its HostSchedule
says (tests/chaos/schedule.py: by the host's own counters of store writes, provider calls
and deliveries, which a file keeps across its restarts):
- the process dies (os._exit: no finally, no message update) just before or just after a
  store write or a provider call; the messages it held come back when their visibility
  ends, which the test plays by making them visible again before the host restarts;
- provider calls fail (errors, throttling, timeouts and permanent errors after the cloud
  acted), from the chaos provider on the shared file cloud;
- a message is sent twice (a copy first, which the other host may run at the same time), or
  kept after it succeeded so that it is delivered again.
Everything notable is appended to an events file (one JSON line per event) for the report.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import mmap
import os
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from shared.settings import Settings
from tests.chaos.file_cloud import FileCloud
from tests.chaos.provider import ChaosCompute
from tests.chaos.schedule import HostSchedule

CONFIG_ENV = "TENSORANT_CHAOS_HOST"
CRASH_EXIT = 70  # the exit status of an injected crash; anything else is a real failure
# Simulated seconds between timer ticks, as in function_app (heartbeat-check every minute,
# the sweeper every 5 minutes); each host ticks at its own offset (HostSchedule).
TIMERS = {"heartbeat_check": 60.0, "sweeper": 300.0}
# In the workdir, read when a host takes over: the runs no provider fault is injected for (the
# coverage runs, which must end as scripted), written by the test once it has created them.
SHIELDED_FILE = "shielded.json"


@dataclass(frozen=True)
class HostConfig:
    name: str
    workdir: str  # holds the clock, round, cloud, events, tally files and the calm and stop files
    seed: int
    workers: int = 2  # messages run at once in one host
    batch: int = 16  # messages taken from each queue per round
    # Wall seconds a taken message stays invisible: longer than any round, so a slow machine
    # never loses one to the other host (a crashed host's messages are given back at once).
    visibility_s: int = 300
    max_dequeue: int = 5
    # A spare process starts, imports and connects, then waits for the file `go-<spare>` before
    # it takes over as the host: the test keeps one ready, so a crash costs no start-up time.
    spare: str = ""

    def to_env(self) -> str:
        return json.dumps(asdict(self))


class SharedClock:
    """Simulated time that every process reads from one 8-byte file it maps; only the test
    advances it, between rounds (while no host runs anything)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, 8)

    @classmethod
    def create(cls, path: Path, start: float) -> SharedClock:
        path.write_bytes(struct.pack("d", start))
        return cls(path)

    def __call__(self) -> float:
        return float(struct.unpack_from("d", self.map)[0])

    def advance(self, seconds: float) -> None:
        struct.pack_into("d", self.map, 0, self() + seconds)


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_round(path: Path) -> tuple[int, float]:
    """The round the test has started (0: none yet), and the simulated time of the one before."""
    try:
        n, prev = path.read_text().split()
    except FileNotFoundError:
        return 0, 0.0
    return int(n), float(prev)


def read_int(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except FileNotFoundError:
        return 0


class Events:
    def __init__(self, path: Path, host: str) -> None:
        self.fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        self.host = host

    def write(self, event: str, /, **fields: Any) -> None:
        # One write per line on an O_APPEND descriptor: lines of several processes never interleave.
        line = json.dumps({"host": self.host, "pid": os.getpid(), "wall": time.time(), "event": event, **fields}) + "\n"
        os.write(self.fd, line.encode())


class Tally:
    """A host's counters (store writes, provider calls, faultable calls, deliveries), kept in a
    file across its restarts: the schedule's n-th store write is the host's n-th, whichever of
    its processes makes it. Each count is written before its decision is acted on, so a
    crash at the n-th write is not made again by the next process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.counts = Counter[str]()

    def load(self) -> None:
        """Read the counts as the host's last process left them (when this process takes over)."""
        self.counts = Counter(json.loads(self.path.read_text()) if self.path.exists() else {})

    def next(self, what: str) -> int:
        with self.lock:
            self.counts[what] += 1
            write_atomically(self.path, json.dumps(self.counts))
            return self.counts[what]


class HostFaults:
    """The crash and fault decisions of one host process (the store and the provider call in)."""

    def __init__(self, cfg: HostConfig, events: Events) -> None:
        self.cfg, self.events = cfg, events
        self.schedule = HostSchedule(cfg.seed, cfg.name)
        self.tally = Tally(Path(cfg.workdir) / f"tally-{cfg.name}.json")
        self.shielded: frozenset[str] = frozenset()
        self.local = threading.local()
        self.calm_path = Path(cfg.workdir) / "calm"

    def calm(self) -> bool:
        return self.calm_path.exists()

    @contextmanager
    def delivery(self, step: str) -> Iterator[None]:
        self.local.step = step
        try:
            yield
        finally:
            self.local.step = None

    def active(self) -> bool:
        return getattr(self.local, "step", None) is not None and not self.calm()

    def die(self, when: str, op: str) -> None:
        self.events.write("crash", step=getattr(self.local, "step", None), op=op, when=when)
        os._exit(CRASH_EXIT)

    # The CrashingStore's hooks, around every store write.
    def before(self, op: str) -> None:
        self.local.die_after = False
        if not self.active():
            return
        when = self.schedule.crash("store", self.tally.next("store"))
        if when == "before":
            self.die("before", op)
        self.local.die_after = when == "after"

    def after(self, op: str) -> None:
        if getattr(self.local, "die_after", False):
            self.die("after", op)

    # The chaos provider's fault callback, before every provider call.
    def pick(self, method: str, run_id: str) -> str | None:
        if not self.active():
            return None
        when = self.schedule.crash("provider", self.tally.next("provider"))
        if when == "before":
            self.die("before", f"provider.{method}")
        if when == "after":
            return "die_after"
        if run_id in self.shielded:
            return None
        kind = self.schedule.fault(self.tally.next("fault"))
        if kind:
            self.events.write("fault", step=self.local.step, method=method, kind=kind)
        return kind


class HostCompute(ChaosCompute):
    """The chaos provider whose "crash after the call" is a real death of the process."""

    def __init__(self, config: BaseModel, settings: Settings, cloud: FileCloud, faults: HostFaults) -> None:
        super().__init__(config, settings, cloud)
        self.faults = faults

    def _after(self, kind: str | None, method: str) -> None:  # type: ignore[override]
        if kind == "die_after":
            self.faults.die("after", f"provider.{method}")
        ChaosCompute._after(kind, method)


class Host:
    def __init__(self, cfg: HostConfig) -> None:
        import function_app
        from shared import clock, queues
        from shared.providers import registry
        from shared.queues import Queue, get_queues
        from shared.settings import get_settings
        from shared.store import set_store
        from tests.chaos.driver import CrashingStore
        from tests.fakes import MemoryConfig
        from tests.harness import app_functions

        self.cfg = cfg
        self.work = Path(cfg.workdir)
        self.stop_path = self.work / "stop"
        self.done_path = self.work / f"done-{cfg.name}"
        self.held_path = self.work / f"held-{cfg.name}.json"
        self.events = Events(self.work / "events.jsonl", cfg.name)
        self.faults = HostFaults(cfg, self.events)
        clock.set_clock(SharedClock(self.work / "clock"))
        queues.configure(delay_scale=0)  # delays are simulated: a delayed message is taken next round
        cloud = FileCloud(self.work / "cloud.json")
        cloud.pick = self.faults.pick
        registry.override("memory", factory=lambda config, settings: HostCompute(config, settings, cloud, self.faults),
                          config_model=MemoryConfig)
        s = get_settings()
        store = CrashingStore(s.storage_connection, s.table_prefix)
        store.faults = self.faults  # type: ignore[assignment]
        set_store(store)
        _, self.queue_fns, self.timer_fns = app_functions(function_app.app)
        q = get_queues()
        self.clients = {queue: q.client(queue.value) for queue in Queue}
        self.poison = {queue: q.client(queue.poison) for queue in Queue}
        self.pool = ThreadPoolExecutor(max_workers=cfg.workers)

    def run(self) -> None:
        parent = os.getppid()
        if self.cfg.spare:
            go = self.work / f"go-{self.cfg.spare}"
            while not go.exists():
                if self.stop_path.exists() or os.getppid() != parent:
                    return
                time.sleep(0.005)  # waiting to take over from a host that died
        self.faults.tally.load()
        self.faults.shielded = frozenset(json.loads((self.work / SHIELDED_FILE).read_text()))
        self.events.write("start")
        done = read_int(self.done_path)
        while not self.stop_path.exists() and os.getppid() == parent:  # the test itself died: stop too
            n, prev = read_round(self.work / "round")
            if n <= done:
                time.sleep(0.005)  # waiting for the test to start the next round
                continue
            self.round(prev)
            write_atomically(self.done_path, str(n))
            done = n
        self.events.write("stop")

    def round(self, prev: float) -> None:
        """The timers that fell due in (prev, now], then one batch from every queue."""
        from shared.clock import now_ts

        t = now_ts()
        for name, every in TIMERS.items():
            offset = self.faults.schedule.timer_offsets[name] * every
            if math.floor((t - offset) / every) > math.floor((prev - offset) / every):
                self.tick(name)
        batch = [(queue, client, m) for queue, client in self.clients.items()
                 for m in client.receive_messages(messages_per_page=self.cfg.batch, max_messages=self.cfg.batch,
                                                  visibility_timeout=self.cfg.visibility_s)]
        # What this process holds, for the test to give back if it dies (see the module docstring).
        write_atomically(self.held_path, json.dumps([[q.value, m.id, m.pop_receipt] for q, _, m in batch]))
        list(self.pool.map(lambda args: self.handle(*args), batch))

    def tick(self, name: str) -> None:
        from azure.functions.timer import TimerRequest

        with self.faults.delivery(name):
            try:
                self.timer_fns[name](TimerRequest(past_due=False))
                self.events.write("timer", name=name, ok=True)
            except Exception as exc:
                self.events.write("timer", name=name, ok=False, error=f"{type(exc).__name__}: {exc}"[:300])

    def handle(self, queue: Any, client: Any, m: Any) -> None:
        import azure.functions as func
        from azure.core.exceptions import AzureError

        key = hashlib.sha256(m.content.encode()).hexdigest()[:16]
        calm = self.faults.calm()
        n = 0 if calm else self.faults.tally.next("delivery")
        if not calm and self.faults.schedule.duplicate(n):
            client.send_message(m.content)  # a duplicate send: the other host may run it at once
            self.events.write("duplicate-send", queue=queue.value, key=key)
        error = ""
        with self.faults.delivery(queue.value):
            try:
                self.queue_fns[queue.value](func.QueueMessage(id=m.id, body=base64.b64decode(m.content),
                                                              pop_receipt=m.pop_receipt))
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
        self.events.write("delivery", queue=queue.value, key=key, message=m.id, dequeue=m.dequeue_count,
                          ok=not error, error=error)
        try:
            if not error:
                if not calm and self.faults.schedule.redeliver(n):
                    client.update_message(m.id, m.pop_receipt, visibility_timeout=0)  # delivered again
                    self.events.write("redeliver", queue=queue.value, key=key)
                else:
                    client.delete_message(m.id, m.pop_receipt)
            elif m.dequeue_count >= self.cfg.max_dequeue:  # what the host does after maxDequeueCount
                self.poison[queue].send_message(m.content)
                client.delete_message(m.id, m.pop_receipt)
                self.events.write("poison", queue=queue.value, key=key)
            else:
                client.update_message(m.id, m.pop_receipt, visibility_timeout=0)
        except AzureError as exc:
            # The message is not ours any more (another delivery holds it now).
            self.events.write("lease-lost", queue=queue.value, key=key, error=type(exc).__name__)


def main() -> int:
    cfg = HostConfig(**json.loads(os.environ[CONFIG_ENV]))
    Host(cfg).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
