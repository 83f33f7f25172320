"""One Functions host of the two-host chaos test: `python -m tests.chaos.host`, started (and
restarted after each crash) by tests/chaos/two_hosts.py with its settings in one environment
variable.

It does what an instance of the Functions host does with this app: polls every step queue on
the shared Azurite, runs the queue functions (a few at a time), moves a message that failed
maxDequeueCount times to `<queue>-poison`, and fires the heartbeat-check and sweeper timers.
Unlike the real host, both instances fire the timers (the real ones hold a singleton lease),
which only makes races more likely.

Until the test makes things calm (a file appears), it also misbehaves:
- the process dies (os._exit: no finally, no message update) just before or just after a
  store write or a provider call, at random; the messages it held come back only when their
  visibility timeout ends, as after a real crash;
- provider calls fail at random (errors, throttling, timeouts and permanent errors after the
  cloud acted), from the chaos provider on the shared file cloud;
- a message is sent twice (a copy first, which the other host may run at the same time), or
  kept after it succeeded so that it is delivered again.
Everything notable is appended to an events file (one JSON line per event) for the report.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from shared.settings import Settings
from tests.chaos.driver import PROVIDER_FAULTS
from tests.chaos.file_cloud import FileCloud
from tests.chaos.provider import ChaosCompute

CONFIG_ENV = "TENSORANT_CHAOS_HOST"
CRASH_EXIT = 70  # the exit status of an injected crash; anything else is a real failure


@dataclass(frozen=True)
class HostConfig:
    name: str
    workdir: str  # holds cloud.json, events.jsonl and the calm and stop files
    clock: tuple[float, float, float]  # (wall start, simulated start, speed): see SpeedClock
    seed: int
    crash_rate: float  # per store write: the process dies just before or just after it
    provider_crash_rate: float  # per provider call, before it and again after it succeeded
    fault_rate: float  # per provider call: an injected provider error
    duplicate_rate: float  # per delivery: a copy sent first; per success: delivered again
    visibility_s: int  # wall seconds a received message stays invisible (returns after a crash)
    heartbeat_check_every_s: float  # wall seconds between the timers' ticks
    sweep_every_s: float
    workers: int = 2  # messages run at once in one host
    max_dequeue: int = 5

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @property
    def speed(self) -> float:
        return self.clock[2]


class SpeedClock:
    """Simulated time that runs `speed` times faster than the wall clock, from one start that
    every process is given, so all of them read the same simulated time."""

    def __init__(self, wall_start: float, sim_start: float, speed: float) -> None:
        self.wall_start, self.sim_start, self.speed = wall_start, sim_start, speed

    def __call__(self) -> float:
        return self.sim_start + (time.time() - self.wall_start) * self.speed


class Events:
    def __init__(self, path: Path, host: str) -> None:
        self.fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        self.host = host

    def write(self, event: str, /, **fields: Any) -> None:
        # One write per line on an O_APPEND descriptor: lines of several processes never interleave.
        line = json.dumps({"host": self.host, "pid": os.getpid(), "event": event, **fields}) + "\n"
        os.write(self.fd, line.encode())


class HostFaults:
    """The crash and fault decisions of one host process (the store and the provider call in)."""

    def __init__(self, cfg: HostConfig, events: Events) -> None:
        self.cfg, self.events = cfg, events
        self.rng = random.Random(cfg.seed)
        self.rng_lock = threading.Lock()
        self.local = threading.local()
        self.calm_path = Path(cfg.workdir) / "calm"

    def calm(self) -> bool:
        return self.calm_path.exists()

    def roll(self, rate: float) -> bool:
        with self.rng_lock:
            return self.rng.random() < rate

    @contextmanager
    def delivery(self, step: str) -> Iterator[None]:
        self.local.step = step
        try:
            yield
        finally:
            self.local.step = None

    def die(self, when: str, op: str) -> None:
        self.events.write("crash", step=getattr(self.local, "step", None), op=op, when=when)
        os._exit(CRASH_EXIT)

    def _maybe_die(self, when: str, op: str) -> None:
        if getattr(self.local, "step", None) is not None and not self.calm() and self.roll(self.cfg.crash_rate):
            self.die(when, op)

    # The CrashingStore's hooks, around every store write.
    def before(self, op: str) -> None:
        self._maybe_die("before", op)

    def after(self, op: str) -> None:
        self._maybe_die("after", op)

    # The chaos provider's fault callback, before every provider call.
    def pick(self, method: str, run_id: str) -> str | None:
        if getattr(self.local, "step", None) is None or self.calm():
            return None
        if self.roll(self.cfg.provider_crash_rate):
            self.die("before", f"provider.{method}")
        if self.roll(self.cfg.provider_crash_rate):
            return "die_after"
        if not self.roll(self.cfg.fault_rate):
            return None
        kinds = [k for k in PROVIDER_FAULTS if k != "crash_after"]  # crashes are real here
        with self.rng_lock:
            kind = self.rng.choices(kinds, weights=[PROVIDER_FAULTS[k] for k in kinds])[0]
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
        work = Path(cfg.workdir)
        self.stop_path = work / "stop"
        self.events = Events(work / "events.jsonl", cfg.name)
        self.faults = HostFaults(cfg, self.events)
        clock.set_clock(SpeedClock(*cfg.clock))
        queues.configure(delay_scale=1 / cfg.speed)  # "in 60 s" is 60 simulated seconds
        cloud = FileCloud(work / "cloud.json")
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
        cfg = self.cfg
        self.events.write("start")
        rng = random.Random(cfg.seed + 1)
        due = {"heartbeat_check": time.time() + rng.uniform(0, cfg.heartbeat_check_every_s),
               "sweeper": time.time() + rng.uniform(0, cfg.sweep_every_s)}
        every = {"heartbeat_check": cfg.heartbeat_check_every_s, "sweeper": cfg.sweep_every_s}
        parent = os.getppid()
        while not self.stop_path.exists() and os.getppid() == parent:  # the test itself died: stop too
            for name, at in due.items():
                if time.time() >= at:
                    self.tick(name)
                    due[name] = time.time() + every[name]
            batch = [(queue, client, m) for queue, client in self.clients.items()
                     for m in client.receive_messages(messages_per_page=8, max_messages=8,
                                                      visibility_timeout=cfg.visibility_s)]
            if batch:
                list(self.pool.map(lambda args: self.handle(*args), batch))
            else:
                time.sleep(0.1)
        self.events.write("stop")

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
        if not calm and self.faults.roll(self.cfg.duplicate_rate):
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
                if not calm and self.faults.roll(self.cfg.duplicate_rate):
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
            # The visibility ran out while the function ran: another delivery holds it now.
            self.events.write("lease-lost", queue=queue.value, key=key, error=type(exc).__name__)


def main() -> int:
    cfg = HostConfig(**{k: tuple(v) if k == "clock" else v for k, v in json.loads(os.environ[CONFIG_ENV]).items()})
    Host(cfg).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
