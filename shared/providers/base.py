"""The one Protocol that every compute provider implements (AWS, Azure, RunPod, local).

Contracts (each implementation states how it meets them in its docstrings):
- Every method translates vendor errors into shared.providers.errors at this boundary.
- launch is idempotent per run: it first looks for the run's machine by its ownership
  marks (tags, or the deterministic name where there are no tags) and only then creates.
  Marks are set at creation, never added later.
- retain / start / release return an Outcome; done=False means "not yet, ask again
  after retry_after_s". release treats "not found" as success and is done only when the
  cloud confirms the machine and its job-created disk and network interface are gone.
- Nothing without this deployment's marks is ever stopped or deleted.
- list_managed pages through the account and yields only this deployment's resources.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from shared.models import Check, CloudResource, GpuOffer, MachineState

TAG_MANAGED = "tensorant:managed"
TAG_DEPLOYMENT = "tensorant:deployment"
TAG_ORG = "tensorant:org"
TAG_RUN = "tensorant:run"


@dataclass(frozen=True)
class RunRef:
    """Who a machine belongs to: enough to find it by its marks."""

    deployment: str
    org: str
    run_id: str

    @property
    def name(self) -> str:
        """Deterministic machine name (RunPod pods, Azure VM/NIC/disk names)."""
        return f"tensorant-{self.deployment}-{self.run_id}"

    @property
    def tags(self) -> dict[str, str]:
        return {
            TAG_MANAGED: "true",
            TAG_DEPLOYMENT: self.deployment,
            TAG_ORG: self.org,
            TAG_RUN: self.run_id,
        }


@dataclass(frozen=True)
class Bootstrap:
    """What the machine needs to run the training container and the agent."""

    container_image: str
    env: dict[str, str]  # agent environment: run id, API URL, run token, storage access
    secret_env_keys: frozenset[str] = frozenset()  # never logged


@dataclass(frozen=True)
class LaunchSpec:
    ref: RunRef
    offer: GpuOffer
    bootstrap: Bootstrap
    disk_gb: int = 0  # 0 = the connection's configured size


@dataclass(frozen=True)
class Outcome:
    done: bool
    detail: str = ""
    retry_after_s: float = 15.0
    billing_note: str = ""


@dataclass(frozen=True)
class Description:
    state: MachineState
    detail: str = ""
    resources: list[CloudResource] = field(default_factory=list)


class ComputeProvider(Protocol):
    name: str

    def validate(self) -> list[Check]:
        """Check credentials and setup without creating anything billable."""
        ...

    def offers(self) -> list[GpuOffer]:
        """Supported single-GPU offers with compute + disk price per hour."""
        ...

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        """Create (or find) the run's machine; return every resource recorded for it."""
        ...

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        ...

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        """Stop/deallocate the machine, keep its disk."""
        ...

    def start(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        """Start a retained machine again (recovery)."""
        ...

    def release(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        """Delete machine, job-created disk and NIC; done only when the cloud confirms."""
        ...

    def list_managed(self) -> Iterable[CloudResource]:
        """This deployment's marked resources, paged, for the sweeper."""
        ...
