"""Pydantic models: API bodies, stored records and queue messages.

All are frozen and forbid unknown fields, so a typo in a request or a message from
a newer schema fails loudly instead of being half-understood. Records and messages
carry a schema version.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SCHEMA_VERSION = 1
ID_PATTERN = r"^[a-z0-9][a-z0-9-]{2,62}$"
# Strict patterns for every id that reaches a table key, a URL, a cloud API or a machine's
# environment (issue 11.2, 11.12): no '/', '#', '?', '\\', whitespace or control characters,
# and a bounded length. Table keys are checked again in the store (shared/store/repo.py).
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
ORG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
PROVIDER_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
# An offer id is built by a provider: region/zone/type (AWS), azure:region:size, runpod-... slugs.
OFFER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$"
# A declared base model id: "name" or "owner/name", Hugging Face style.
BASE_MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$"


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------- enums


class RunState(StrEnum):
    draft = "draft"
    queued = "queued"
    provisioning = "provisioning"
    preparing = "preparing"
    training = "training"
    exporting = "exporting"
    verifying = "verifying"
    releasing = "releasing"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    retaining = "retaining"
    retained = "retained"
    recovering = "recovering"


class Outcome(StrEnum):
    """Where a run goes once its release is confirmed."""

    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class Role(StrEnum):
    owner = "owner"
    member = "member"
    admin = "admin"


class CheckStatus(StrEnum):
    ok = "ok"
    warn = "warn"
    fail = "fail"


class ConnectionStatus(StrEnum):
    checking = "checking"
    connected = "connected"
    failed = "failed"


class RunKind(StrEnum):
    trial = "trial"
    full = "full"


class MachineState(StrEnum):
    pending = "pending"
    running = "running"
    stopping = "stopping"
    stopped = "stopped"
    gone = "gone"
    unknown = "unknown"


# ---------------------------------------------------------------- shared value types


class Check(Model):
    name: str
    status: CheckStatus
    message: str


class GpuOffer(Model):
    provider: str
    offer_id: str
    gpu: str
    gpu_memory_gb: float
    gpu_count: int = 1
    machine_type: str
    region: str
    zone: str = ""
    compute_per_hour: float
    disk_per_hour: float
    total_per_hour: float
    currency: str = "USD"
    note: str = ""


class CloudResource(Model):
    """One thing a provider created for a run, as recorded in the ledger."""

    provider: str
    kind: str  # instance | volume | vm | disk | nic | pod | process | workdir
    id: str
    name: str = ""
    region: str = ""
    run_id: str = ""
    org: str = ""
    deployment: str = ""
    managed: bool = True
    created_at: datetime | None = None
    state: str = ""
    extra: dict[str, str] = Field(default_factory=dict)


class RunEvent(Model):
    v: int = SCHEMA_VERSION
    at: datetime
    kind: str  # transition | log | audit | warning
    message: str
    state: RunState | None = None
    data: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- records


class ConnectionRecord(Model):
    v: int = SCHEMA_VERSION
    org: str
    slot: str  # compute:<provider> | storage
    provider: str
    status: ConnectionStatus
    config: dict[str, Any]  # public part only; secrets live in `sealed`
    sealed: str  # AES-GCM of the full config JSON
    location: str = ""  # storage: where data lives (for change refusal)
    checks: list[Check] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    saved_at: datetime
    checked_at: datetime | None = None
    revision: int = 1


class CatalogRecord(Model):
    v: int = SCHEMA_VERSION
    org: str
    provider: str
    offers: list[GpuOffer]
    fetched_at: datetime | None = None
    last_error: str = ""
    last_error_at: datetime | None = None
    note: str = ""


class ProjectRecord(Model):
    v: int = SCHEMA_VERSION
    org: str
    id: str
    name: str
    created_at: datetime


class DatasetVersionRecord(Model):
    v: int = SCHEMA_VERSION
    org: str
    project_id: str
    id: str
    rows: int
    sha256: str
    size_bytes: int
    storage_key: str
    created_at: datetime


class Deadlines(Model):
    provisioning_by: datetime | None = None
    heartbeat_by: datetime | None = None
    runtime_by: datetime | None = None


class RunRecord(Model):
    v: int = SCHEMA_VERSION
    org: str
    id: str
    project_id: str
    kind: RunKind
    provider: str
    offer: GpuOffer
    price_limit_per_hour: float
    runtime_limit_s: int
    dataset_version_id: str
    base_model: str
    state: RunState = RunState.draft
    outcome: Outcome | None = None
    phase: str = ""
    progress: float = 0.0
    reason: str = ""
    billing_note: str = ""
    # When the retained machine was started for recovery (GPU billing resumed); None once
    # it is stopped again (POST /api/runs/{id}/stop, or heartbeat-check's idle stop).
    machine_started_at: datetime | None = None
    created_at: datetime
    updated_at: datetime
    state_changed_at: datetime
    launched_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    deadlines: Deadlines = Field(default_factory=Deadlines)
    machine_name: str = ""
    resources: list[CloudResource] = Field(default_factory=list)
    adapter_sha256: str = ""
    adapter_size: int = 0
    release_attempts: int = 0
    release_error: str = ""
    release_after: datetime | None = None
    log_lines: int = 0
    created_by: str = ""


# ---------------------------------------------------------------- queue messages


class StepMessage(Model):
    """Body of every run step message (launch, verify, retain, release)."""

    v: Literal[1] = 1
    org: str
    run_id: str
    reason: str = ""


class ConnectionMessage(Model):
    """Body of validate-connection and refresh-catalog messages."""

    v: Literal[1] = 1
    org: str
    slot: str


# ---------------------------------------------------------------- API bodies


class ProjectCreate(Model):
    name: str = Field(min_length=1, max_length=100)


class RunCreate(Model):
    project_id: str = Field(pattern=KEY_PATTERN)
    kind: RunKind = RunKind.trial
    provider: str = Field(pattern=PROVIDER_PATTERN)
    offer_id: str = Field(pattern=OFFER_PATTERN)
    price_limit_per_hour: float = Field(gt=0, le=1000)
    runtime_limit_s: int | None = Field(default=None, ge=60, le=7 * 24 * 3600)
    dataset_version_id: str = Field(pattern=KEY_PATTERN)
    base_model: str = Field(pattern=BASE_MODEL_PATTERN, description="a declared model id: name or owner/name")

    @field_validator("offer_id", "base_model")
    @classmethod
    def _no_dot_segments(cls, v: str) -> str:
        if ".." in v or "//" in v:
            raise ValueError("may not contain '..' or '//'")
        return v


class RunLaunch(Model):
    confirm: bool


class RunCancel(Model):
    # No default: a run that may hold output (training and later) loses its only copy of
    # the adapter on a discard, so the caller says which (issue 12.2). Drafts, queued runs
    # and runs whose machine has not trained yet need none.
    discard: bool | None = Field(default=None, description=(
        "true: release the machine and disk and delete any output on them; false: stop the machine and keep "
        "its disk for recovery. Required for a run that may hold output."))


class RunRecover(Model):
    """Recovery without an upload: verify the adapter already in storage."""

    mode: Literal["verify_saved", "start_machine"] = "verify_saved"


class Heartbeat(Model):
    phase: Literal["provisioning", "preparing", "training", "exporting"]
    progress: float = Field(default=0.0, ge=0.0, le=1.0)
    logs: list[str] = Field(default_factory=list, max_length=500)


class AgentComplete(Model):
    status: Literal["ok", "failed"]
    sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")
    size: int = Field(default=0, ge=0)
    reason: str = Field(default="", max_length=2000)
    exit_code: int | None = None
    # status failed: whether the machine holds output worth recovering (files in the output
    # directory, an adapter.zip). None (an agent that does not say) = maybe: the run is retained.
    output_exists: bool | None = None
    last_lines: list[Annotated[str, Field(max_length=2000)]] = Field(default_factory=list, max_length=20)


class HeartbeatReply(Model):
    """The control plane's answer to a heartbeat."""

    state: RunState
    stop: bool = Field(description="true: the run no longer trains; stop the trainer and keep the output")
    # A fresh agent token, sent while the current one has less than half its life left: the
    # agent switches to it (tokens are short-lived and refused once the run has ended).
    token: str = ""
    token_expires_at: datetime | None = None


class SweepRequest(Model):
    dry_run: bool = True


class ReplayRequest(Model):
    message_id: str | None = None  # None = replay all


class RunView(Model):
    id: str
    org: str
    project_id: str
    kind: RunKind
    provider: str
    state: RunState
    outcome: Outcome | None
    phase: str
    progress: float
    reason: str
    billing_note: str
    offer: GpuOffer
    estimate_per_hour: float
    price_limit_per_hour: float
    runtime_limit_s: int
    base_model: str
    dataset_version_id: str
    resources: list[CloudResource]
    adapter_sha256: str
    release_error: str
    release_attempts: int
    created_at: datetime
    updated_at: datetime
    events: list[RunEvent] = Field(default_factory=list)


class ConnectionView(Model):
    slot: str
    provider: str
    status: ConnectionStatus
    config: dict[str, Any]
    checks: list[Check]
    warnings: list[str]
    saved_at: datetime
    checked_at: datetime | None


class Problem(Model):
    type: str = "about:blank"
    title: str
    status: int
    detail: str = ""
    errors: list[dict[str, Any]] = Field(default_factory=list)
