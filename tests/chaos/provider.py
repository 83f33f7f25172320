"""A fault-injecting in-memory provider for the chaos, sweeper, heartbeat-check and poison tests.

Hand-written (no emulator exists for "a cloud"): it wraps tests.fakes.MemoryCompute, keeps
its contracts (marks at creation, find-before-create, "not found" = released), and adds what
real clouds do to a control plane:
- a fault per call, chosen by a callback: an error before the call, throttling, a timeout
  or a permanent error after the call succeeded (Azure creates the VM even when allocation
  fails), or a crash of the handler before or after the call;
- a new machine invisible to find-by-marks and to listing for a while (ids still work);
- a lock, so concurrent deliveries see one consistent account;
- a history of every machine ever created per run ("no run ever had two machines").
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel

from shared.clock import now_ts
from shared.errors import PermanentError, RetryableError, ThrottledError
from shared.models import CloudResource
from shared.providers import registry
from shared.providers.base import CloudProgress, Description, LaunchSpec, RunRef
from shared.settings import Settings
from tests.fakes import Cloud, Machine, MemoryCompute, MemoryConfig


class Crash(Exception):
    """The handler process died here (raised at a chosen provider call or store write)."""


# Fault kinds: raised before the cloud call, or after it succeeded.
BEFORE = ("crash", "error", "permanent", "throttle")
AFTER = ("timeout", "crash_after", "permanent_after")

FaultPicker = Callable[[str, str], str | None]  # (method, run_id) -> fault kind or None


class ChaosCloud(Cloud):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.RLock()
        self.invisible_s = 0.0
        self.visible_at: dict[str, float] = {}
        self.created = Counter[str]()
        self.pick: FaultPicker = lambda method, run_id: None
        self.always: dict[str, Exception] = {}  # method -> raised on every call (simple tests)
        self.injected = Counter[str]()

    def visible(self, m: Machine) -> bool:
        return now_ts() >= self.visible_at.get(m.id, 0.0)

    def add_foreign(self, tags: dict[str, str], created_at: Any) -> Machine:
        """A machine the control plane did not create (or created for a run it forgot)."""
        with self.lock:
            n = next(self.ids)
            m = Machine(id=f"i-{n:04d}", tags=dict(tags), disk_id=f"vol-{n:04d}", created_at=created_at)
            self.machines[m.id] = m
            return m


class ChaosCompute(MemoryCompute):
    name = "memory"
    cloud: ChaosCloud

    def __init__(self, config: BaseModel, settings: Settings, cloud: ChaosCloud) -> None:
        super().__init__(config, settings, cloud)

    def _fault(self, method: str, run_id: str) -> str | None:
        if method in self.cloud.always:
            raise self.cloud.always[method]
        kind = self.cloud.pick(method, run_id)
        if kind:
            self.cloud.injected[kind] += 1
        if kind == "crash":
            raise Crash(f"crash before {method}")
        if kind == "error":
            raise RetryableError(f"injected {method} error", retry_after_s=30)
        if kind == "permanent":
            raise PermanentError(f"injected permanent {method} error")
        if kind == "throttle":
            raise ThrottledError(f"injected throttling on {method}", retry_after_s=20)
        return kind

    @staticmethod
    def _after(kind: str | None, method: str) -> None:
        if kind == "timeout":
            raise RetryableError(f"injected timeout after {method} succeeded", retry_after_s=30)
        if kind == "crash_after":
            raise Crash(f"crash after {method} succeeded")
        if kind == "permanent_after":  # Azure AllocationFailed: the VM resource exists anyway
            raise PermanentError(f"injected permanent {method} error after the cloud created the resource")

    def _find(self, ref: RunRef) -> Machine | None:
        m = super()._find(ref)
        return m if m is not None and self.cloud.visible(m) else None

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        with self.cloud.lock:
            kind = self._fault("launch", spec.ref.run_id)
            before = set(self.cloud.machines)
            out = super().launch(spec)
            for mid in set(self.cloud.machines) - before:
                self.cloud.created[spec.ref.run_id] += 1
                self.cloud.visible_at[mid] = now_ts() + self.cloud.invisible_s
        self._after(kind, "launch")
        return out

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        with self.cloud.lock:
            kind = self._fault("describe", ref.run_id)
            out = super().describe(ref, resources)
        self._after(kind, "describe")
        return out

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        with self.cloud.lock:
            kind = self._fault("retain", ref.run_id)
            out = super().retain(ref, resources)
        self._after(kind, "retain")
        return out

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        with self.cloud.lock:
            kind = self._fault("release", ref.run_id)
            # Only what is visible by marks, or named by id, is found (like a real cloud).
            ids = {r.id for r in resources if r.kind == "instance"}
            for m in self._owned(ref, resources):
                if m.id in ids or self.cloud.visible(m):
                    m.state, m.disk_exists = "terminated", False
            self.cloud.calls.append("release")
            out = CloudProgress(done=True)
        self._after(kind, "release")
        return out

    def list_managed(self) -> Iterable[CloudResource]:
        with self.cloud.lock:
            kind = self._fault("list", "")
            self.cloud.calls.append("list")
            out = [r for m in self.cloud.live() if self.cloud.visible(m)
                   and m.tags.get("tensorant:deployment") == self.deployment for r in self._res(m)]
        self._after(kind, "list")
        return out


_undo: list[registry.Undo] = []  # what install_chaos_provider did


def install_chaos_provider(cloud: ChaosCloud) -> None:
    _undo.append(registry.override("memory", factory=lambda config, settings: ChaosCompute(config, settings, cloud),
                                   config_model=MemoryConfig))


def uninstall_chaos_provider() -> None:
    while _undo:
        _undo.pop()()
