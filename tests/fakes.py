"""A hand-written in-memory compute provider (no emulator exists for "a cloud"): used by the
flow tests and, with faults layered on, by the chaos test. It keeps the same contracts as
the real providers: marks at creation, find-before-create, "not found" = released."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from shared.clock import now
from shared.errors import PermanentError
from shared.models import Check, CheckStatus, CloudResource, GpuOffer, MachineState
from shared.providers import registry
from shared.providers.base import CloudProgress, Description, LaunchSpec, RunRef, attempt_of_tags, marks_extra
from shared.settings import Settings


class MemoryConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    account: str = "acct-1"


@dataclass
class Machine:
    id: str
    tags: dict[str, str]
    state: str = "running"  # running | stopped | shutting-down | terminated
    disk_id: str = ""
    disk_exists: bool = True
    created_at: Any = None
    env: dict[str, str] = field(default_factory=dict)
    image: str = ""


class Cloud:
    """The fake account: machines and disks, shared by every provider instance."""

    def __init__(self) -> None:
        self.machines: dict[str, Machine] = {}
        self.ids = itertools.count(1)
        self.calls: list[str] = []
        self.launch_error: Exception | None = None
        self.before_create: Any = None  # called inside launch, before the machine exists
        # Deletions accepted but not confirmed: a released machine stays shutting-down, its disk kept,
        # and release answers not done until this is cleared (as a cloud's asynchronous delete).
        self.hold_deletes = False
        self.preflight_no: dict[str, str] = {}  # offer id -> what preflight answers against it
        # Refusals per machine type (issue 37): the create of that type raises the error; with
        # `refuse_after_create`, only after making the machine (as an Azure VM that failed allocation, or an
        # EC2 instance that went pending -> terminated, leaves something to release).
        self.refuse: dict[str, Exception] = {}
        self.refuse_after_create = False

    def live(self) -> list[Machine]:
        return [m for m in self.machines.values() if m.state != "terminated" or m.disk_exists]


OFFER = GpuOffer(provider="memory", offer_id="mem-a10", gpu="A10", gpu_memory_gb=24, machine_type="mem.a10",
                 region="local", compute_per_hour=1.0, disk_per_hour=0.01, total_per_hour=1.01)


STATE_MAP = {"running": MachineState.running, "stopped": MachineState.stopped,
             "shutting-down": MachineState.stopping}


class MemoryCompute:
    name = "memory"

    def __init__(self, config: BaseModel, settings: Settings, cloud: Cloud) -> None:
        self.cloud = cloud
        self.deployment = settings.deployment_id

    def validate(self) -> list[Check]:
        self.cloud.calls.append("validate")
        return [Check(name="credentials", status=CheckStatus.ok, message="fake account")]

    def preflight(self, offer: GpuOffer, ref: RunRef | None = None) -> str | None:
        return self.cloud.preflight_no.get(offer.offer_id)

    def scope(self) -> dict[str, str]:
        return {}  # one in-process cloud: nothing to compare

    def offers(self) -> list[GpuOffer]:
        self.cloud.calls.append("offers")
        return [OFFER]

    def _find(self, ref: RunRef) -> Machine | None:
        for m in self.cloud.machines.values():
            if m.tags.get("tensorant:run") == ref.run_id and m.tags.get("tensorant:deployment") == ref.deployment \
                    and m.state != "terminated" and attempt_of_tags(m.tags) == ref.attempt:
                return m
        return None

    def _res(self, m: Machine) -> list[CloudResource]:
        base = {"provider": "memory", "run_id": m.tags.get("tensorant:run", ""), "org": m.tags.get("tensorant:org", ""),
                "deployment": m.tags.get("tensorant:deployment", ""), "created_at": m.created_at,
                "managed": m.tags.get("tensorant:managed") == "true", "attempt": attempt_of_tags(m.tags),
                "extra": marks_extra(m.tags)}
        out = [CloudResource(kind="instance", id=m.id, state=m.state, **base)]
        if m.disk_exists:
            out.append(CloudResource(kind="volume", id=m.disk_id, **base))
        return out

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        self.cloud.calls.append("launch")
        found = self._find(spec.ref)
        if found and found.state == "failed":  # a create that failed allocation (refuse_after_create)
            raise self.cloud.refuse.get(spec.offer.machine_type) or RuntimeError("failed machine")
        if found:
            return self._res(found)
        if self.cloud.launch_error:
            raise self.cloud.launch_error
        refusal = self.cloud.refuse.get(spec.offer.machine_type)
        if refusal is not None and not self.cloud.refuse_after_create:
            raise refusal
        if self.cloud.before_create:
            self.cloud.before_create()
        n = next(self.cloud.ids)
        m = Machine(id=f"i-{n:04d}", tags=dict(spec.ref.tags), disk_id=f"vol-{n:04d}", created_at=now(),
                    env=dict(spec.bootstrap.env), image=spec.bootstrap.container_image)
        self.cloud.machines[m.id] = m
        if refusal is not None:
            m.state = "failed"  # left behind in a failed state, as Azure leaves a VM whose allocation failed
            raise refusal
        return self._res(m)

    def _owned(self, ref: RunRef, resources: list[CloudResource]) -> list[Machine]:
        ids = {r.id for r in resources if r.kind == "instance"}
        ms = [m for m in self.cloud.machines.values() if m.id in ids or
              (m.tags.get("tensorant:run") == ref.run_id and m.tags.get("tensorant:deployment") == ref.deployment
               and attempt_of_tags(m.tags) == ref.attempt)]
        return [m for m in ms if m.tags.get("tensorant:deployment") == self.deployment]

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        self.cloud.calls.append("describe")
        ms = [m for m in self._owned(ref, resources) if m.state != "terminated"]
        if not ms:
            return Description(MachineState.gone)
        return Description(STATE_MAP[ms[0].state])

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        self.cloud.calls.append("retain")
        for m in self._owned(ref, resources):
            if m.state == "running":
                m.state = "stopped"
        return CloudProgress(done=True, billing_note="compute stopped; the disk still bills")

    def start(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        self.cloud.calls.append("start")
        owned = [m for m in self._owned(ref, resources) if m.state != "terminated"]
        if not owned:
            raise PermanentError(f"no machine of run {ref.run_id} to start", code="not_found")
        for m in owned:
            if m.state == "stopped":
                m.state = "running"
        return CloudProgress(done=True)

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        self.cloud.calls.append("release")
        owned = self._owned(ref, resources)
        for m in owned:
            if not self.cloud.hold_deletes:
                m.state, m.disk_exists = "terminated", False
            elif m.state != "terminated":
                m.state = "shutting-down"
        if any(m.state != "terminated" or m.disk_exists for m in owned):
            return CloudProgress(done=False, detail="the machine is shutting down", retry_after_s=5)
        return CloudProgress(done=True)

    def list_managed(self) -> Iterable[CloudResource]:
        self.cloud.calls.append("list")
        for m in self.cloud.live():
            if m.tags.get("tensorant:deployment") == self.deployment:
                yield from self._res(m)


H100 = GpuOffer(provider="memory", offer_id="mem-h100", gpu="H100", gpu_memory_gb=80, machine_type="mem.h100",
                region="local", compute_per_hour=3.0, disk_per_hour=0.01, total_per_hour=3.01)


class TwoOffers(MemoryCompute):
    """The A10 and an H100: a model too big for the A10 still fits one offer."""

    def offers(self) -> list[GpuOffer]:
        return [OFFER, H100]


def draft(h: Any, base_model: str = "tensorant/tiny-llama", **fields: Any) -> tuple[int, Any]:
    """POST /api/runs as a member on the A10 offer (a project with 100 rows): (status, body)."""
    pid, dsid = h.project_and_dataset(rows=100)
    body = {"project_id": pid, "dataset_version_id": dsid, "provider": "memory", "offer_id": "mem-a10",
            "base_model": base_model, "price_limit_per_hour": 10.0, **fields}
    status, got, _ = h.call("POST", "/api/runs", token="member", json_body=body)
    return status, got


_undo: list[registry.Undo] = []  # what install_memory_provider did


def training_run(h: Any) -> tuple[str, Any]:
    """A run on the memory provider whose agent has reported `training`: (run id, its TestAgent)."""
    run_id = h.create_run("memory", "mem-a10")
    h.launch(run_id)
    agent = h.agent(run_id)
    agent.heartbeat("training", 0.1)
    return run_id, agent


def install_memory_provider(cloud: Cloud, compute: type[MemoryCompute] = MemoryCompute) -> None:
    """Serve the "memory" provider with `compute` (MemoryCompute or a subclass) on `cloud`."""
    _undo.append(registry.override("memory", factory=lambda config, settings: compute(config, settings, cloud),
                                   config_model=MemoryConfig))


def uninstall_memory_provider() -> None:
    while _undo:
        _undo.pop()()


def serve_memory(cloud: Cloud, compute: type[MemoryCompute] = MemoryCompute) -> Iterator[Cloud]:
    """The body of a `cloud` fixture: the "memory" provider served with `compute` on `cloud` for one test."""
    install_memory_provider(cloud, compute)
    try:
        yield cloud
    finally:
        uninstall_memory_provider()

