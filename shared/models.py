"""Pydantic models: API bodies, stored records and queue messages.

All are frozen and forbid unknown fields, so a typo in a request or a message from
a newer schema fails loudly instead of being half-understood. Records and messages
carry a schema version.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 1
ID_PATTERN = r"^[a-z0-9][a-z0-9-]{2,62}$"
# Strict patterns for every id that reaches a table key, a URL, a cloud API or a machine's
# environment (a '/' or '#' would name another row, a line break would add a variable): no '/', '#', '?',
# '\\', whitespace or control characters,
# and a bounded length. Table keys are checked again in the store (shared/store/repo.py).
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
ORG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
PROVIDER_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
# A compute connection's name: `{provider}` (the provider's default connection) or `{provider}/{name}`
# (another account or region of that provider, e.g. aws/us-west-2). The provider part is checked against
# the registry (aws, azure, runpod, local; a test's override); the stored key spells '/' as '|'.
CONNECTION_PATTERN = r"^[a-z][a-z0-9_-]{0,31}(/[a-z0-9][a-z0-9-]{0,39})?$"
CONNECTION_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"  # the part after the '/'
# An offer id is built by a provider: region/zone/type (AWS), azure:region:size, runpod-... slugs.
OFFER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$"
# A declared base model id: "name" or "owner/name", Hugging Face style.
BASE_MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$"
# A Hub revision: a 40-hex commit id, or a branch or tag name (resolved to its commit id once, at create).
BASE_MODEL_REVISION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


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
    connection: str = ""  # the compute connection it is offered through; "" = the provider's default


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
    # The launch attempt that made it (its marks carry it: tag tensorant:attempt, or the name's -try<n>;
    # 0 = the first, unmarked): the sweeper releases an abandoned attempt's resources (issue 37).
    attempt: int = 0


class RunEvent(Model):
    v: int = SCHEMA_VERSION
    at: datetime
    kind: str  # transition | log | audit | warning
    message: str
    state: RunState | None = None
    data: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- training settings


MAX_KEEP_CHECKPOINTS = 10


class TrainingSettings(Model):
    """A run's training settings: the TENSORANT_TRAINING fields of the cross-team contract
    (names, defaults and ranges as machine/trainer/config.py checks them again on the machine).

    In POST /api/runs every field is optional; the run stores the resolved settings (trial
    bounds applied, `kind` set from the run's kind) and hands them to the trainer as JSON."""

    lora_r: int = Field(default=16, ge=1, le=256, strict=True)
    lora_alpha: int = Field(default=32, ge=1, le=1024, strict=True)
    lora_dropout: float = Field(default=0.05, ge=0.0, le=0.5)
    target_modules: Literal["attention", "all-linear"] = Field(
        default="attention", description="attention = q, k, v, o projections; all-linear adds gate, up, down")
    learning_rate: float = Field(default=2e-4, gt=0.0, le=0.01)
    epochs: float = Field(default=1.0, gt=0.0, le=20.0)
    max_steps: int | None = Field(default=None, ge=1, le=100000, strict=True, description="overrides epochs")
    batch_size: int = Field(default=4, ge=1, le=256, strict=True)
    gradient_accumulation: int = Field(default=1, ge=1, le=256, strict=True)
    warmup_ratio: float = Field(default=0.03, ge=0.0, le=0.5)
    max_seq_len: int = Field(default=1024, ge=16, le=32768, strict=True)
    precision: Literal["auto", "bf16", "fp32"] = Field(
        default="auto", description="auto: bf16 on a GPU that supports it, else fp32")
    load_in_4bit: bool = Field(default=False, strict=True, description="QLoRA via bitsandbytes; needs a CUDA GPU")
    gradient_checkpointing: bool = Field(default=True, strict=True)
    batching: Literal["auto", "padded", "grouped", "packed"] = Field(default="auto", description=(
        "how examples share a batch: padded (as they come), grouped (by length, little padding), packed "
        "(a batch's examples end to end in one row, attention kept within each; Llama, Mistral and Qwen "
        "families); auto picks the fastest correct one for the device"))
    packed_attention: Literal["auto", "segments", "flex"] = Field(default="auto", description=(
        "how a packed row keeps attention within each example: segments (sdpa per example), flex (torch flex "
        "attention with a document mask; CUDA GPUs only); auto times both on a GPU"))
    seed: int = Field(default=42, ge=0, le=2**32 - 1, strict=True)
    eval_fraction: float = Field(default=0.1, ge=0.0, le=0.5,
                                 description="held-out split, only when the dataset has >= 20 examples")
    sample_prompts: int = Field(default=3, ge=0, le=10, strict=True)
    max_examples: int | None = Field(default=None, ge=1, le=10_000_000, strict=True,
                                     description="train on at most this many examples (trial runs: set for you)")
    kind: Literal["trial", "full"] | None = Field(default=None, description="set from the run's kind")
    checkpoint_every_steps: int = Field(default=50, ge=1, le=100000, strict=True, description=(
        "save a checkpoint (adapter + optimizer state) on the machine's disk every this many steps"))
    checkpoint_every_s: int = Field(default=600, ge=30, le=7 * 24 * 3600, strict=True, description=(
        "and at least every this many seconds; a retained run can be verified or resumed from it"))
    keep_checkpoints: int = Field(default=3, ge=1, le=MAX_KEEP_CHECKPOINTS, strict=True, description=(
        "how many of the newest checkpoints' adapters are kept in storage (GET /api/runs/{id}/checkpoints); "
        "each newer one replaces the oldest"))
    eval_every_steps: int | None = Field(default=None, ge=1, le=100000, strict=True, description=(
        "evaluate on the held-out split every this many steps (the run's eval curve); the adapter of the "
        "best evaluation is the one written (keep_best)"))
    early_stopping_patience: int | None = Field(default=None, ge=1, le=1000, strict=True, description=(
        "stop after this many evaluations in a row that did not improve the best eval loss by more than "
        "early_stopping_threshold (needs eval_every_steps)"))
    early_stopping_threshold: float = Field(default=0.0, ge=0.0, le=10.0)
    keep_best: bool = Field(default=True, strict=True, description=(
        "with eval_every_steps: write the adapter of the best evaluation, not the last step's"))
    chat_template: str | None = Field(default=None, max_length=16384, description=(
        "the chat template to train with: chatml, llama3, plain, or a Jinja chat template's text; "
        "default: the base model's own"))
    train_on_inputs: bool = Field(default=False, strict=True, description=(
        "loss on every token of a chat row (prompts and system turns too), not only the assistant's"))
    use_dora: bool = Field(default=False, strict=True, description="DoRA: weight-decomposed LoRA")
    use_rslora: bool = Field(default=False, strict=True, description="rank-stabilised scaling alpha / sqrt(r)")
    neftune_alpha: float | None = Field(default=None, gt=0.0, le=50.0, description=(
        "NEFTune: noise on the input embeddings while training (5 is usual)"))
    lr_scheduler: Literal["cosine", "linear", "constant"] = Field(default="cosine", description="after the warmup")
    warmup_steps: int | None = Field(default=None, ge=0, le=100000, strict=True, description="overrides warmup_ratio")
    optimizer: Literal["adamw", "adamw_8bit", "sgd"] = Field(default="adamw", description=(
        "adamw_8bit: bitsandbytes, on a CUDA GPU; sgd: momentum 0.9"))
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    merged: bool = Field(default=False, strict=True, description=(
        "also deliver the adapter merged into the base model's weights (GET /api/runs/{id}/adapter?format=merged), "
        "verified like the adapter; for base models of up to about 1.5B parameters (3 GiB of merged weights)"))
    method: Literal["sft", "dpo"] = Field(default="sft", description=(
        "sft: supervised fine-tuning on examples; dpo: direct preference optimization on a dataset of pairs "
        "(prompt, chosen, rejected), the reference model being the base with the adapter disabled"))
    dpo_beta: float = Field(default=0.1, gt=0.0, le=10.0, description=(
        "DPO: how far the trained model may move from the reference (smaller = further)"))
    dpo_loss: Literal["sigmoid", "ipo"] = Field(default="sigmoid", description=(
        "DPO loss: sigmoid (the DPO paper's) or ipo (squared, bounded margin)"))

    @field_validator("lora_dropout", "learning_rate", "epochs", "warmup_ratio", "eval_fraction",
                     "early_stopping_threshold", "neftune_alpha", "weight_decay", "dpo_beta", mode="before")
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        # pydantic would read "0.1" or true as a number; the trainer would not.
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ValueError("must be a number")
        return v

    @field_validator("chat_template")
    @classmethod
    def _a_template(cls, v: str | None) -> str | None:
        # The names of machine/trainer/templates.PRESETS (the trainer renders and checks the text itself).
        if v is not None and v not in ("chatml", "llama3", "plain") and "messages" not in v:
            raise ValueError("must be chatml, llama3, plain or a Jinja chat template (which loops over messages)")
        return v

    @model_validator(mode="after")
    def _early_stopping_needs_evaluations(self) -> TrainingSettings:
        if self.early_stopping_patience is not None and self.eval_every_steps is None:
            raise ValueError("early_stopping_patience needs eval_every_steps: it decides on evaluations during training")
        return self


class Forecast(Model):
    """A run's predicted training time and cost, made at create (and at a draft's edit) from the
    dataset's size, the planned steps and the offer's GPU (shared/runs/forecast.py says how)."""

    training_s: int = Field(description="predicted seconds of training (optimizer steps)")
    startup_s: int = Field(description="fixed allowance: machine boot, image pull, model download and load")
    total_s: int = Field(description="startup_s + training_s")
    cost: float = Field(description="total_s at the offer's price per hour, in the offer's currency")
    tokens: int = Field(description="tokens the training processes: steps x examples per step x tokens per example")
    tokens_source: Literal["estimated from bytes"] = Field(
        default="estimated from bytes", description="how the dataset's tokens were counted")
    steps: int = Field(description="optimizer steps the trainer will plan (max_steps, else epochs over the rows)")
    throughput_tokens_per_s: float = Field(description="assumed training throughput on the offer's GPU")
    basis: str = Field(description="the figures and assumptions behind the forecast, in words")
    uncertainty: str = Field(default="", description=(
        "how far off the forecast may be, in words: set while no like run (same model, GPU and settings) was "
        "measured and the pace is the table's estimate; empty when a measured pace was used"))


class ForecastCheck(Model):
    """The forecast against what the trainer measured, recorded when a run's final adapter is verified:
    the throughput table is an assumption, and each finished run says how far off it was."""

    training_s: float = Field(description="seconds of training the trainer measured (its manifest's train_seconds)")
    tokens: int = Field(description="tokens the trainer processed, padding excluded (its manifest's tokens)")
    steps: int = Field(description="optimizer steps the trainer ran")
    training_error: float = Field(
        description="forecast training_s / measured - 1: 0.25 means the forecast was 25 % long, -0.2 20 % short")
    tokens_error: float = Field(description="forecast tokens / measured - 1, as training_error")
    throughput_tokens_per_s: float = Field(description="measured tokens per second of training")


class OrgSecretSet(Model):
    """PUT /api/org/secrets/huggingface-token: write-only, never returned."""

    # Hugging Face tokens are "hf_" and 30-odd letters and digits. The pattern also keeps a common
    # string ("00000000") from becoming a secret that every log line and error text would be masked by.
    token: str = Field(min_length=23, max_length=512, pattern=r"^hf_[A-Za-z0-9]{20,509}$",
                       description="a Hugging Face access token (hf_...)", repr=False,
                       json_schema_extra={"format": "password", "writeOnly": True})  # a secret: forms hide it


class OrgMlflowSet(Model):
    """PUT /api/org/secrets/mlflow: where the trainer logs its parameters, losses, evaluations and the adapter's
    digest. Write-only, sealed, handed to the trainer only (the machine reaches the server, never the control
    plane)."""

    tracking_uri: str = Field(max_length=2000, pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?(/[^\s]*)?$",
                              description="the MLflow tracking server's http(s) URL", repr=False)
    token: str | None = Field(default=None, min_length=8, max_length=4096, pattern=r"^[\x21-\x7e]+$",
                              description="sent as a Bearer token (MLFLOW_TRACKING_TOKEN)", repr=False)
    experiment: str = Field(default="tensorant", min_length=1, max_length=250, pattern=r"^[\w .:/-]+$")


class OrgWandbSet(Model):
    """PUT /api/org/secrets/wandb: a Weights & Biases API key for the trainer (write-only, sealed)."""

    api_key: str = Field(min_length=40, max_length=128, pattern=r"^[A-Za-z0-9_-]+$", repr=False)
    project: str = Field(default="tensorant", min_length=1, max_length=128, pattern=r"^[\w.-]+$")


class OrgSecretsView(Model):
    huggingface_token: dict[str, bool]
    mlflow: dict[str, bool] = Field(default_factory=lambda: {"set": False})
    wandb: dict[str, bool] = Field(default_factory=lambda: {"set": False})


class OrgSecretRecord(Model):
    v: int = SCHEMA_VERSION
    org: str
    name: str
    sealed: str  # AES-GCM of {"value": ...} with "<org>|secret:<name>" as associated data
    saved_at: datetime
    saved_by: str = ""


# ---------------------------------------------------------------- records


class ConnectionRecord(Model):
    v: int = SCHEMA_VERSION
    org: str
    slot: str  # compute:<provider> | compute:<provider>/<name> | storage
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
    connection: str = ""  # whose catalog (one per compute connection); "" = the provider's default
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
    # examples: SFT rows (messages, prompt+completion, text); pairs: preference pairs for method dpo
    # (prompt+chosen+rejected, or messages+chosen+rejected). A version is one or the other, never both.
    format: Literal["examples", "pairs"] = "examples"


class Deadlines(Model):
    provisioning_by: datetime | None = None
    # A cloud-init machine (AWS, Azure) must exchange its bootstrap claim by then (it booted and
    # reached the control plane); the exchange moves provisioning_by to the pull's allowance.
    first_report_by: datetime | None = None
    heartbeat_by: datetime | None = None
    runtime_by: datetime | None = None


class Notice(Model):
    """One outside event of a run not yet handed to its webhook deliveries (the run's outbox): written
    in the same write as the change it tells of, removed once its deliveries are queued
    (shared/runs/outbox.py), so a crash in between delays it, never loses it."""

    id: str = Field(pattern=r"^msg_[A-Za-z0-9_-]{8,64}$")  # the webhook-id of every delivery of it
    type: str = Field(max_length=64)
    at: datetime
    state: str = ""
    reason: str = Field(default="", max_length=2000)


class Billing(Model):
    """A run's billed time, kept on its record where the machine's billing changes (retained, started for
    recovery or a resume, stopped): a list or the usage summary reads no events (shared/runs/billing.py).
    The open segment runs from `since` (the first one: from the run's machine_up_at) to now, the
    confirmed release, or the run's end."""

    machine_s: float = 0.0  # closed segments with the machine running
    disk_only_s: float = 0.0  # closed segments with only its disk kept
    since: datetime | None = None
    machine_running: bool = True  # in the open segment


MAX_CANDIDATES = 8


class CandidateRequest(Model):
    """One acceptable (connection, offer) of a run, as the API takes it."""

    connection: str = Field(pattern=CONNECTION_PATTERN, description=(
        "a compute connection: the provider's default (`aws`) or a named one (`aws/us-west-2`)"))
    offer_id: str = Field(pattern=OFFER_PATTERN)

    @field_validator("offer_id")
    @classmethod
    def _no_dot_segments(cls, v: str) -> str:
        if ".." in v or "//" in v:
            raise ValueError("may not contain '..' or '//'")
        return v


class RunCandidate(Model):
    """A checked candidate as the run stores it: its connection and the offer (with its price) it was checked at."""

    connection: str
    offer: GpuOffer


class CandidateView(Model):
    connection: str
    provider: str
    offer_id: str
    gpu: str
    total_per_hour: float


class RunAttempt(Model):
    """One launch attempt on one candidate (shared/services/steps/launch.py). `index` is its place in the run's
    attempts and is carried by the marks of whatever the attempt created."""

    index: int
    connection: str
    provider: str
    offer_id: str
    gpu: str
    price_per_hour: float
    started_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: Literal["launched", "refused", "skipped", "failed"]
    code: str = ""
    message: str = ""
    seconds: float = 0.0
    # Whether what a refused attempt may have created was confirmed gone (the next attempt waits for it).
    released: bool = True


class RetentionCountdown(Model):
    """The retention warning's countdown, on one clock: `stay` is the state_changed_at of the stay in retained
    it was warned in; `period` when the control plane's serving period whose clock counts it began
    (heartbeat_check.serving_since: a clock jump, or an instance whose clock disagrees, starts a new one);
    `started` when it started, on that clock."""

    stay: datetime
    period: datetime
    started: datetime


class CheckpointInfo(Model):
    """One checkpoint adapter the agent saved in storage, in slot `slot` of the run's ring of
    keep_checkpoints slots (runs/<id>/checkpoints/slot-<n>.zip): reported by the agent in its heartbeats."""

    step: int = Field(ge=1, le=10_000_000, strict=True)
    slot: int = Field(ge=0, lt=MAX_KEEP_CHECKPOINTS, strict=True)
    saved_at: datetime
    train_loss: float | None = Field(default=None, ge=0.0, le=1e6)
    eval_loss: float | None = Field(default=None, ge=0.0, le=1e6)
    size: int = Field(ge=0, le=2**40, strict=True)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class VerifyProgress(Model):
    """How far the verify step's download of an archive got (issue 38): `offset` of `size` bytes of `artifact`,
    spooled on `host` (a spool is that instance's own file: shared/services/steps/verify_spool.py)."""

    artifact: Literal["adapter", "merged"]
    offset: int = Field(ge=0)
    size: int = Field(ge=0)
    host: str = ""
    # Names this verification's spools: a spool of an earlier verification of the run (another token) is
    # never appended to.
    token: str = Field(default="", pattern=r"^[0-9a-f]{0,32}$")
    # The state_changed_at of the stay it belongs to: a progress left by an earlier verification (a run
    # given up on by heartbeat-check, then recovered) is not carried on.
    since: datetime | None = None


class RunRecord(Model):
    v: int = SCHEMA_VERSION
    org: str
    id: str
    project_id: str
    kind: RunKind
    provider: str
    offer: GpuOffer
    # The compute connection of the current candidate ("" = the provider's default, `provider`).
    connection: str = ""
    price_limit_per_hour: float
    runtime_limit_s: int
    dataset_version_id: str
    validation_dataset_version_id: str = ""  # "" = the eval split is held out of the training rows
    base_model: str
    # A base model named by Hub id: the commit id its shapes were read at and the machine loads ("": declared).
    base_model_revision: str = ""
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
    # Billing timeline: the create call, and the cloud's confirmed release.
    machine_up_at: datetime | None = None
    released_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    deadlines: Deadlines = Field(default_factory=Deadlines)
    machine_name: str = ""
    # Where the machine was created (shared.providers.base.scope_of at launch: account, region,
    # resource group): release, retain and the sweeper act only in this scope.
    scope: dict[str, str] = Field(default_factory=dict)
    resources: list[CloudResource] = Field(default_factory=list)
    adapter_sha256: str = ""
    adapter_size: int = 0
    # Why the run was retained, kept through a recovery: a refused recovery says it again with its
    # refusal instead of replacing it (shared/services/steps/verify_adapter.py).
    retained_reason: str = ""
    release_attempts: int = 0
    release_error: str = ""
    release_after: datetime | None = None
    # Claims and marks, each its own field (never updated_at, which any write moves): the launch
    # step's last create claim (store.leases.claim_launch: the next is granted launch_settle_s() after it), and
    # heartbeat-check's last re-send of a lost step message.
    launch_claimed_at: datetime | None = None
    resent_at: datetime | None = None
    log_lines: int = 0
    created_by: str = ""
    # The resolved training settings (stored at create, handed to the trainer)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    # The draft as the user asked for it (before defaults and trial bounds; training.kind left
    # out): a draft's edit applies its fields to this and checks the result as a
    # create, so a kind switch re-resolves the trial's bounds. None on older records.
    request: RunCreate | None = None
    # The last refusal of a call that named this run with a token the control plane could not accept
    # (a rotated signing key, an expired token): said in the reason if the heartbeat then goes silent.
    agent_refused: str = ""
    agent_refused_at: datetime | None = None
    # When the machine exchanged its bootstrap claim for its environment (once: a second is refused).
    bootstrap_claimed_at: datetime | None = None
    # When the control plane last started the retained machine (recover start_machine or resume), and when its
    # agent exchanged the token that expired while the machine was stopped for a fresh one (once per start: a
    # second is refused; shared/services/api/boot.py exchange_restart).
    restart_requested_at: datetime | None = None
    restart_exchanged_at: datetime | None = None
    # Said once: the trainer's pace will not finish the planned steps within the runtime limit.
    pace_warned: bool = False
    # The pace's clock: when a heartbeat of the current training period first reported progress (the first
    # optimizer step done), and that progress. The model's loading and one-time conversion before it (minutes
    # on a CPU) are not the trainer's pace; a resumed run starts from its checkpoint's progress.
    pace_from: datetime | None = None
    pace_from_progress: float = 0.0
    # The runtime limit passed after the trainer finished every planned step (while it ran its final eval and
    # samples): heartbeat-check sent the run to verify the final adapter the agent had uploaded, not to retaining.
    finished_at_limit: bool = False
    # Recorded by the retain step when the machine is stopped: whether an adapter of the run (a checkpoint's or the
    # final one) is in storage then. False: nothing to verify or resume from (a cancel before the first checkpoint).
    adapter_saved: bool | None = None
    # The forecast made at create (remade at a draft's edit); None on records older than forecasts.
    forecast: Forecast | None = None
    # The forecast against the trainer's own figures, once its final adapter is verified.
    forecast_check: ForecastCheck | None = None
    # The billed time so far (Billing); None on records from before it, whose time comes from their events.
    billing: Billing | None = None
    # Set by heartbeat-check with the move to retaining when the run missed a deadline before it ever reported
    # training (nothing was trained on the machine): the retain step releases it, failed, unless a checkpoint
    # of it is in storage (shared/runs/retention.py). An owner's cancel that keeps the disk never sets it.
    release_if_nothing_saved: bool = False
    # When heartbeat-check warned that the retention limit is near (once per stay in retained).
    retention_warned_at: datetime | None = None
    # The warning's countdown to the discard (shared/runs/retention.py); None until the warning.
    retention_countdown: RetentionCountdown | None = None
    # The state the last state change moved from, written by that change (shared/runs/moves.move_stored): the
    # run view shows the change even before its transition event is written (events.pending_transition).
    moved_from: RunState | None = None
    # What the verified adapter is: "final" (training ended) or "checkpoint" (the adapter of the checkpoint
    # at checkpoint_step of planned_steps: an incomplete training the owner accepted as the run's adapter).
    # None until an adapter is verified.
    adapter_kind: Literal["final", "checkpoint"] | None = None
    checkpoint_step: int | None = None
    planned_steps: int | None = None
    # The recovery under way may end with a checkpoint's adapter (the owner said accept_checkpoint).
    accept_checkpoint: bool = False
    # training.merged: the merged model's archive (runs/<id>/merged.zip) as the agent reported it, kept by the
    # verify step only when it passes (adapter_format.merged); merged_note says why a run that asked has none.
    merged_sha256: str = ""
    merged_size: int = 0
    merged_note: str = ""
    # The verify step's download carried over to its next invocation (None when none is under way).
    verify_progress: VerifyProgress | None = None
    # The run's outbox: outside events (webhooks) written with the change they tell of (Notice).
    notices: list[Notice] = Field(default_factory=list)
    # Candidates and attempts (issue 37): `provider` and `offer` above are always the current candidate's.
    # connection (above): the candidate's connection ("" = the provider's default); candidates: every acceptable
    # (connection, offer) in order, empty = the single provider/offer; candidate_index: the one tried now;
    # attempts: every attempt decided so far (the one in flight has index len(attempts)).
    candidates: list[RunCandidate] = Field(default_factory=list)
    candidate_index: int = 0
    attempts: list[RunAttempt] = Field(default_factory=list)
    capacity_wait_s: int = 0
    # When the run began waiting for capacity (every candidate refused once): capacity_wait_s counts from it.
    capacity_wait_since: datetime | None = None
    # The checkpoint adapters in storage, oldest step first (at most training.keep_checkpoints).
    checkpoints: list[CheckpointInfo] = Field(default_factory=list)


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


class SweepTarget(Model):
    """One more account of a sweep-account message's batch."""

    org: str = Field(pattern=ORG_PATTERN)
    provider: str = Field(pattern=PROVIDER_PATTERN)
    connection: str = Field(default="", pattern=r"^$|" + CONNECTION_PATTERN)  # "" = the provider's default


class SweepMessage(Model):
    """Body of a sweep-account message: sweep one compute connection (org, provider) once.

    `sweep` names the sweep that sent it (the timer's tick or an admin's request): a second delivery
    of one sweep's message finds it done and does nothing. `report`: keep the findings under the
    sweep's id for GET /api/platform/sweeps/{id} (admin sweeps; the timer's are audited only)."""

    v: Literal[1] = 1
    org: str = Field(pattern=ORG_PATTERN)
    provider: str = Field(pattern=PROVIDER_PATTERN)
    sweep: str = Field(pattern=KEY_PATTERN)
    # The compute connection swept ("" = the provider's default: messages sent before names existed).
    connection: str = Field(default="", pattern=r"^$|" + CONNECTION_PATTERN)
    dry_run: bool = False
    report: bool = False
    # More accounts swept by the same invocation (the timer's fan-out sends accounts in batches: one queue
    # request per batch, not per account); the message's own org/provider is the batch's first.
    batch: list[SweepTarget] = Field(default_factory=list, max_length=16)


# ---------------------------------------------------------------- API bodies


class ProjectCreate(Model):
    name: str = Field(min_length=1, max_length=100)


class RunCreate(Model):
    project_id: str = Field(pattern=KEY_PATTERN)
    kind: RunKind = RunKind.trial
    provider: str = Field(pattern=PROVIDER_PATTERN)
    offer_id: str = Field(pattern=OFFER_PATTERN)
    # The compute connection to run on: `{provider}` (the default when left out) or `{provider}/{name}`.
    connection: str | None = Field(default=None, pattern=CONNECTION_PATTERN)
    price_limit_per_hour: float = Field(gt=0, le=1000)
    runtime_limit_s: int | None = Field(default=None, ge=60, le=7 * 24 * 3600)
    dataset_version_id: str = Field(pattern=KEY_PATTERN)
    validation_dataset_version_id: str | None = Field(default=None, pattern=KEY_PATTERN, description=(
        "a dataset version of the same project to evaluate on (all of its rows, up to the trainer's cap) instead "
        "of holding out training.eval_fraction of the training rows"))
    base_model: str = Field(pattern=BASE_MODEL_PATTERN, description=(
        "a declared model id (GET /api/base-models), or any Hub model id of a supported architecture with "
        "base_model_revision"))
    base_model_revision: str | None = Field(default=None, pattern=BASE_MODEL_REVISION_PATTERN, description=(
        "the Hub revision of base_model: a commit id, or a branch or tag resolved to its commit id at create"))
    # Training settings; omitted fields take the defaults, a trial run is bounded
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    candidates: list[CandidateRequest] | None = Field(default=None, max_length=MAX_CANDIDATES, description=(
        "the acceptable (connection, offer) pairs in order, at most 8; the launch tries the next when a cloud has "
        "no capacity, quota or stock for one. provider/offer_id may be left out: they are the first candidate's"))
    fallback: Literal["none", "fitting"] = Field(default="none", description=(
        "fitting: add every offer of the organization's connected accounts that holds the model at these settings "
        "and is under the price limit (up to 8 in all), cheapest forecast cost first"))
    capacity_wait_s: int = Field(default=0, ge=0, le=7 * 24 * 3600, description=(
        "when every candidate refused: how long to keep trying the list again (backing off) before the run fails; "
        "at most the organization's max_capacity_wait_s"))

    @model_validator(mode="before")
    @classmethod
    def _first_candidate(cls, data: Any) -> Any:
        # provider/offer_id left out: the first candidate's (its connection names the provider).
        if isinstance(data, dict) and data.get("candidates") and isinstance(data["candidates"], list):
            first = data["candidates"][0]
            if isinstance(first, dict):
                data = dict(data)
                data.setdefault("provider", str(first.get("connection", "")).split("/", 1)[0])
                data.setdefault("offer_id", first.get("offer_id"))
                if "/" in str(first.get("connection", "")) and data.get("offer_id") == first.get("offer_id"):
                    data.setdefault("connection", first.get("connection"))
        return data

    @field_validator("offer_id", "base_model")
    @classmethod
    def _no_dot_segments(cls, v: str) -> str:
        if ".." in v or "//" in v:
            raise ValueError("may not contain '..' or '//'")
        return v


RunRecord.model_rebuild()  # its `request` is a RunCreate, defined after it


class RunPatch(Model):
    """An edit of a draft: the fields of RunCreate, all optional (project_id is fixed). The
    edited draft is checked whole, as a create of it would be, so an edit cannot skip a check."""

    kind: RunKind | None = None
    provider: str | None = Field(default=None, pattern=PROVIDER_PATTERN)
    offer_id: str | None = Field(default=None, pattern=OFFER_PATTERN)
    connection: str | None = Field(default=None, pattern=CONNECTION_PATTERN)
    price_limit_per_hour: float | None = Field(default=None, gt=0, le=1000)
    runtime_limit_s: int | None = Field(default=None, ge=60, le=7 * 24 * 3600)
    dataset_version_id: str | None = Field(default=None, pattern=KEY_PATTERN)
    validation_dataset_version_id: str | None = Field(default=None, pattern=r"^$|" + KEY_PATTERN, description=(
        "a validation dataset version of the project; \"\" drops the draft's"))
    base_model: str | None = Field(default=None, pattern=BASE_MODEL_PATTERN)
    base_model_revision: str | None = Field(default=None, pattern=BASE_MODEL_REVISION_PATTERN)
    training: TrainingSettings | None = Field(default=None, description=(
        "the training settings to change; the ones left out keep the draft's (null clears an optional one)"))
    candidates: list[CandidateRequest] | None = Field(default=None, max_length=MAX_CANDIDATES)
    fallback: Literal["none", "fitting"] | None = None
    capacity_wait_s: int | None = Field(default=None, ge=0, le=7 * 24 * 3600)

    @field_validator("offer_id", "base_model")
    @classmethod
    def _no_dot_segments(cls, v: str | None) -> str | None:
        if v is not None and (".." in v or "//" in v):
            raise ValueError("may not contain '..' or '//'")
        return v


class RunLaunch(Model):
    confirm: bool


class RunCancel(Model):
    # No default: a run that may hold output (training and later) loses its only copy of
    # the adapter on a discard, so the caller says which. Drafts, queued runs
    # and runs whose machine has not trained yet need none.
    discard: bool | None = Field(default=None, description=(
        "true: release the machine and disk and delete any output on them; false: stop the machine and keep "
        "its disk for recovery. Required for a run that may hold output."))


class RunRecover(Model):
    """Recovery without an upload: verify the adapter already in storage."""

    mode: Literal["verify_saved", "start_machine", "resume"] = Field(default="verify_saved", description=(
        "verify_saved: verify the adapter in storage (the final one, else the last checkpoint's); start_machine: "
        "start the machine to fetch files; resume: start the machine and continue training from the last "
        "checkpoint to the planned steps"))
    accept_checkpoint: bool = Field(default=False, strict=True, description=(
        "true: a checkpoint's adapter (training stopped before its planned steps) may end the run, marked "
        "adapter_kind checkpoint; false: such an archive is refused and the run stays retained (resume it "
        "instead). With an application/zip upload: the query parameter accept_checkpoint=true"))
    checkpoint: int | None = Field(default=None, ge=1, le=10_000_000, strict=True, description=(
        "verify_saved: the step of a kept checkpoint (GET /api/runs/{id}/checkpoints) whose adapter ends the run "
        "(implies accept_checkpoint); resume: must be the newest kept checkpoint (only it is on the machine's disk)"))


class Heartbeat(Model):
    phase: Literal["provisioning", "preparing", "training", "exporting"] = Field(description=(
        "the phase the agent is in; a phase behind the run's (a late or repeated heartbeat) does not move it back"))
    # Strict: "0.5" or true is a broken agent, refused with 422 rather than read as a number.
    progress: float = Field(default=0.0, ge=0.0, le=1.0, strict=True)
    logs: list[Annotated[str, Field(strict=True)]] = Field(default_factory=list, max_length=500)
    # The checkpoint adapters the agent has put in the run's checkpoint slots (its whole current list).
    checkpoints: list[CheckpointInfo] = Field(default_factory=list, max_length=MAX_KEEP_CHECKPOINTS)


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
    # status failed: what failed, when the agent knows (the run's reason names it); absent = the trainer.
    stage: Literal["dataset", "training", "export", "upload"] | None = None
    # status ok with training.merged: the merged model's archive (merged.zip), when the machine made one.
    merged_sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")
    merged_size: int = Field(default=0, ge=0)


class BootstrapClaim(Model):
    """The one-time claim a cloud-init machine's user data holds (shared/providers/bootstrap_env.py)."""

    claim: str = Field(min_length=1, max_length=300)


class BootstrapGrant(Model):
    """The machine's environment, given once for its claim: the agent's env file line and the run's token."""

    bootstrap: str = Field(description="TENSORANT_BOOTSTRAP: base64 of the agent's environment (a JSON object)")
    token: str = Field(description="the run's agent token, for the machine's own failure report")


class RestartGrant(Model):
    """What an agent whose retained machine was started again gets for its expired token, once per start."""

    token: str = Field(description="a fresh agent token for the same org and run")
    token_expires_at: datetime
    bootstrap: str = Field(description=(
        "base64 of a JSON object: the storage access and deadline the agent continues with (presigned URLs "
        "handed at launch may have expired while the machine was stopped)"))


class BootFailure(Model):
    """The machine's own report that training never started (cloud-init's bootstrap script,
    shared/providers/cloudinit.py): the image pull, the container start or the agent failed
    before the agent reported. Sent with the run's agent token."""

    stage: Literal["pull", "start", "agent"] = Field(description=(
        "pull: docker pull failed after its retries; start: docker could not start the container "
        "(e.g. no NVIDIA runtime); agent: the agent exited before it reported"))
    # Strict: JSON true and "1" are not exit codes (lax ints took them).
    exit_code: int = Field(ge=-1, le=255, strict=True)
    attempts: int = Field(default=1, ge=1, le=100, strict=True)
    last_lines: list[Annotated[str, Field(max_length=2000)]] = Field(default_factory=list, max_length=20)


class HeartbeatReply(Model):
    """The control plane's answer to a heartbeat."""

    state: RunState
    stop: bool = Field(description="true: the run no longer trains; stop the trainer and keep the output")
    resume: bool = Field(default=False, description=(
        "true: the run was resumed from its last checkpoint (recover mode resume): train again from it"))
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
    validation_dataset_version_id: str = ""
    resources: list[CloudResource]
    # A base model named by Hub id: the commit id it was pinned to at create ("": a declared model).
    base_model_revision: str = ""
    adapter_sha256: str
    release_error: str
    release_attempts: int
    created_at: datetime
    updated_at: datetime
    events: list[RunEvent] = Field(default_factory=list)
    # The resolved training settings
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    # Time and cost: seconds, and money in the offer's currency at the price
    # recorded at launch. Billed machine time runs from the create call to the confirmed
    # release, less the time the machine was stopped with only its disk kept.
    started_at: datetime | None = None
    machine_up_at: datetime | None = None
    released_at: datetime | None = None
    elapsed_s: float | None = None
    billed_machine_s: float = 0.0
    billed_disk_only_s: float = 0.0
    cost_so_far: float = 0.0
    final_cost: float | None = None
    warnings: list[str] = Field(default_factory=list)
    # Predicted training time and cost (null on runs created before forecasts), and once the run's
    # adapter is verified, the forecast's error against what the trainer measured.
    forecast: Forecast | None = None
    forecast_check: ForecastCheck | None = None
    # What the verified adapter is: "final", or "checkpoint" (at checkpoint_step of planned_steps, accepted
    # by the owner at a recovery: not a completed training); null until an adapter is verified.
    adapter_kind: Literal["final", "checkpoint"] | None = None
    checkpoint_step: int | None = None
    planned_steps: int | None = None
    # training.merged: the verified merged model (GET /api/runs/{id}/adapter?format=merged), or why there is none.
    merged_sha256: str = ""
    merged_size: int = 0
    merged_note: str = ""
    # Candidates and attempts (issue 37): every acceptable candidate in order, each launch attempt, and the
    # candidate the machine runs on (null until one launched).
    candidates: list[CandidateView] = Field(default_factory=list)
    attempts: list[RunAttempt] = Field(default_factory=list)
    ran_on: CandidateView | None = None
    # A retained run: whether an adapter of it (a checkpoint's, or the final one) was in storage when its machine
    # was stopped; false: nothing to verify or resume from. None: not retained, or not known.
    adapter_saved: bool | None = None


class RunEstimate(Model):
    """What a run request would be as a draft, without saving it (POST /api/runs/forecast): the same
    checks and resolution as a create, so a form can show the price and forecast as it changes."""

    offer: GpuOffer
    price_limit_per_hour: float
    runtime_limit_s: int = Field(description="the runtime limit the draft would get (the user's, else the default "
                                             "or the forecast's)")
    max_cost: float = Field(description="the offer's price per hour over the runtime limit: the most the run "
                                        "can cost in GPU time")
    forecast: Forecast
    limit_note: str = Field(default="", description="why the runtime limit is not the default, when it is not")
    warnings: list[str] = Field(default_factory=list, description="what the draft's limits will refuse or not cover")


class ConnectionView(Model):
    slot: str
    provider: str
    name: str = ""  # a compute connection's name: `{provider}` or `{provider}/{name}`; "" for storage
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
