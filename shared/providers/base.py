"""The one Protocol that every compute provider implements (AWS, Azure, RunPod, local).

Contracts (each implementation states how it meets them in its docstrings):
- Every method translates vendor errors into shared.errors at this boundary.
- launch is idempotent per run: it first looks for the run's machine by its ownership
  marks (tags, or the deterministic name where there are no tags) and only then creates.
  Marks are set at creation, never added later.
- retain / start / release return a CloudProgress; done=False means "not yet, ask again
  after retry_after_s". release treats "not found" as success and is done only when the
  cloud confirms the machine and its job-created disk and network interface are gone.
- Nothing without this deployment's marks is ever stopped or deleted.
- list_managed pages through the account and yields only this deployment's resources.

Resuming training (a provider whose ProviderInfo says resumes_training): start() brings the
retained machine back with the disk retain() kept, and the training container starts again on it
on that boot (cloud-init's script runs on every boot on AWS and Azure; RunPod runs a resumed pod's
entrypoint). Its agent finds the stopped run's checkpoint on the disk and continues from it when
the control plane's heartbeat reply says resume (machine/agent/agent.py), to the planned steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from shared.models import Check, CloudResource, GpuOffer, MachineState
from shared.providers.console import MAX_CHARS, UNAVAILABLE, bounded

TAG_MANAGED = "tensorant:managed"
TAG_DEPLOYMENT = "tensorant:deployment"
TAG_ORG = "tensorant:org"
TAG_RUN = "tensorant:run"
# The state store that launched it (shared/store/installation.py): two control planes that share a
# deployment id and a cloud account would otherwise each take the other's machines for leaks.
TAG_STORE = "tensorant:store"
# The compute connection that launched it (`aws`, `aws/us-west-2`): two connections that reach the
# same account and region each sweep only their own machines (shared/services/steps/sweep_account.py).
TAG_CONNECTION = "tensorant:connection"


# The refusals every cloud answers that the control plane acts on differently: failover on capacity and quota,
# a connection check on auth, "gone" on not found, a delayed retry on throttling. Each provider's errors.py maps
# its cloud's codes for each in ERROR_TABLE (kind -> codes, as the cloud's wire carries them); a kind the cloud
# does not have is named in ABSENT_KINDS with the reason (only "quota" may be). The provider contract
# (tests/providers/contract.py) has the fake cloud answer every code and checks the error class it becomes.
ERROR_KINDS = ("capacity", "quota", "auth", "not_found", "throttled")


def marks_extra(tags: dict[str, str]) -> dict[str, str]:
    """The marks a listed resource carries beyond the run's, for CloudResource.extra: `store` (the
    launching state store) and `connection` (the launching compute connection), where tagged."""
    return {**({"store": tags[TAG_STORE]} if tags.get(TAG_STORE) else {}),
            **({"connection": tags[TAG_CONNECTION]} if tags.get(TAG_CONNECTION) else {})}
# The launch attempt (issue 37: a run may try several candidates): absent on the first (0), so a run's
# first machine is marked and named as before; `-try<n>` ends the names of a later attempt's resources.
TAG_ATTEMPT = "tensorant:attempt"
_ATTEMPT_SUFFIX = re.compile(r"^(?P<run>.+)-try(?P<n>[1-9][0-9]{0,2})$")


def split_attempt(run_part: str) -> tuple[str, int]:
    """(run id, attempt) of the run part of a deterministic name (`r-abc` -> 0, `r-abc-try2` -> 2)."""
    m = _ATTEMPT_SUFFIX.match(run_part)
    return (m["run"], int(m["n"])) if m else (run_part, 0)


def attempt_of_tags(tags: dict[str, str]) -> int:
    value = tags.get(TAG_ATTEMPT, "")
    return int(value) if value.isdigit() and len(value) <= 3 else 0


@dataclass(frozen=True)
class RunRef:
    """Who a machine belongs to: enough to find it by its marks."""

    deployment: str
    org: str
    run_id: str
    store: str = ""  # the launching state store's installation id ("" where unknown: not tagged)
    connection: str = ""  # the launching compute connection's name ("" where unknown: not tagged)
    attempt: int = 0  # the launch attempt (TAG_ATTEMPT): a later candidate's machine is marked apart

    @property
    def name(self) -> str:
        """Deterministic machine name (RunPod pods, Azure VM/NIC/disk names)."""
        return f"tensorant-{self.deployment}-{self.run_id}" + (f"-try{self.attempt}" if self.attempt else "")

    @property
    def tags(self) -> dict[str, str]:
        return {
            TAG_MANAGED: "true",
            TAG_DEPLOYMENT: self.deployment,
            TAG_ORG: self.org,
            TAG_RUN: self.run_id,
            **({TAG_STORE: self.store} if self.store else {}),
            **({TAG_CONNECTION: self.connection} if self.connection else {}),
            **({TAG_ATTEMPT: str(self.attempt)} if self.attempt else {}),
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
    # What the run may cost and how long its machine must stay manageable: a provider
    # refuses a launch it already knows it could not finish or clean up (AWS session
    # credentials that expire before must_work_until, RunPod credit that cannot cover
    # price_limit_per_hour x runtime_limit_s). 0 / None = unknown, not checked.
    price_limit_per_hour: float = 0.0
    runtime_limit_s: int = 0
    must_work_until: datetime | None = None


@dataclass(frozen=True)
class CloudProgress:
    """How far a retain, start or release got: done, or not yet (ask again after retry_after_s).
    Not models.Outcome, which is where a run goes once its release is confirmed."""

    done: bool
    detail: str = ""
    retry_after_s: float = 15.0
    billing_note: str = ""


@dataclass(frozen=True)
class Description:
    state: MachineState
    detail: str = ""
    resources: list[CloudResource] = field(default_factory=list)
    # The cloud's own words on why the machine is where it is (EC2 StateReason, Azure instance
    # view statuses and boot diagnostics, RunPod desiredStatus and lastStatusChange): shown on
    # the run when its machine never reported. Empty = the cloud gave no reason.
    reason: str = ""


def scope_of(provider: ComputeProvider) -> dict[str, str]:
    """The provider's scope() as a plain dict (see ComputeProvider.scope)."""
    return dict(provider.scope())


def console_of(provider: Any, ref: RunRef, resources: list[CloudResource]) -> str:
    """The last lines of the run's machine console as the cloud keeps them (EC2 console output, the
    Azure boot diagnostics serial log), for a machine that never reported; "" when the provider
    has none (RunPod, local) or no machine exists.

    Providers offer it as an optional `console_output(ref, resources) -> str` method (not in the
    Protocol: providers and fakes without a console, RunPod and local, need nothing). It is a
    separate read, not part of describe(), because describe is called often (retain, the sweeper,
    connection checks) and a console read costs extra cloud calls; callers ask for it only where a
    machine failed to start (heartbeat-check's deadline, a boot-failed release). Never raises: a
    failure reads "console output unavailable: <why>". The text is scrubbed of secrets and bounded
    (shared/providers/console.py) here as well as by the provider.
    """
    fn = getattr(provider, "console_output", None)
    if not callable(fn):
        return ""
    try:
        text = str(fn(ref, resources) or "")
    except Exception as exc:  # a provider bug or an untranslated error must not fail the caller
        reason = getattr(exc, "reason", "") or type(exc).__name__
        return bounded(UNAVAILABLE + str(reason), 300)
    return bounded(text, MAX_CHARS + 200)


def scope_differs(recorded: dict[str, str], current: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The keys whose values differ between a run's recorded scope and a connection's scope
    ({} = same scope, or nothing to compare: a key missing on either side is not compared)."""
    return {k: (recorded[k], current[k]) for k in sorted(recorded) if k in current and recorded[k] != current[k]}


class ComputeProvider(Protocol):
    """One cloud's compute, built by the registry as `build(config, settings)`.

    Errors: every method raises only shared.errors (vendor errors are translated
    inside the provider): PermanentError and its kinds (AuthError, QuotaError,
    CapacityError) when retrying cannot help, RetryableError / ThrottledError when a later
    call may succeed. "Owned" below means the resource carries this deployment's marks
    (tags, or the deterministic name RunRef.name where the cloud has no tags).
    """

    name: str

    def validate(self) -> list[Check]:
        """Check credentials and setup without creating anything billable.

        Idempotent (reads only). Problems are returned as failed/warn Checks with a fix hint,
        not raised; raises only when the provider cannot run checks at all.
        """
        ...

    def offers(self) -> list[GpuOffer]:
        """Supported single-GPU offers with compute + disk price per hour.

        Idempotent (reads only). An empty catalog (no supported GPU where the connection
        points) raises PermanentError with what to change; pricing outages raise
        ProviderError/RetryableError.
        """
        ...

    def preflight(self, offer: GpuOffer, ref: RunRef | None = None) -> str | None:
        """Why `offer` cannot start now, from what the connection may read before creating anything
        (Azure compute usages: the VM family's and the regional vCPUs; AWS Service Quotas: the family's
        On-Demand vCPUs, with the optional servicequotas:GetServiceQuota grant), e.g. "Standard
        NCADSH100v5 Family vCPUs: 0 of 40 free in eastus ...". None: nothing known against it (it fits,
        or the provider cannot tell: RunPod's stock is checked by launch itself, local has no quota).

        A read; never raises (a read that fails is None: the launch reports the cloud's own refusal).
        `ref`: the run it is for; a machine of that run that already exists is never a reason (a
        repeated launch finds it). A "no" skips the candidate; it never fails a run by itself.
        """
        ...

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        """Create (or find) the run's machine; return every resource recorded for it.

        Idempotent per run: first looks for an owned machine of spec.ref and returns it
        instead of creating a second one; marks are set at creation, never later. A
        concurrent or retried call yields the same machine. Raises CapacityError/QuotaError
        when the cloud cannot give the machine, AuthError on rejected credentials,
        RetryableError when a retry may succeed.
        """
        ...

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        """The run's machine state, from the recorded resources or, without them, its marks.

        Idempotent (reads only). Not found = Description(state=MachineState.gone), never an
        error. Raises only for errors reading the cloud.
        """
        ...

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        """Stop/deallocate the machine, keep its disk.

        Idempotent: a stopped machine is done=True again. Not found = done=True (nothing
        left to stop; the detail says nothing is retained). done=False = the cloud has not
        confirmed the stop yet: call again after retry_after_s. Raises PermanentError for a
        machine that is not owned (it is never touched).
        """
        ...

    def start(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        """Start a retained machine again (recovery).

        Idempotent: a running machine is done=True. Not found raises PermanentError (there
        is nothing to start). done=False = starting or still stopping: call again after
        retry_after_s. CapacityError when the host has no GPU for it now.
        """
        ...

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        """Delete machine, job-created disk and NIC; done only when the cloud confirms.

        Idempotent. Not found = done=True (success). done=False = deletion asked but the
        cloud still shows the machine or its disk: call again after retry_after_s. Raises
        PermanentError for a machine that is not owned (never deleted).
        """
        ...

    def list_managed(self) -> Iterable[CloudResource]:
        """This deployment's marked resources, paged, for the sweeper.

        Idempotent (reads only). Pages through the whole account and yields only owned
        resources (never another deployment's or an unmarked one); nothing found = empty.
        """
        ...

    def scope(self) -> dict[str, str]:
        """Where this connection creates machines: the account (AWS account + region, Azure
        subscription + resource group + region, RunPod account).

        A run records it at launch; a connection re-saved into another scope cannot see or
        delete that run's machine, so release, retain and the sweeper compare it first. May
        call the cloud (STS for the AWS account id) and raise ProviderError. {} = nothing to
        compare (one host, as for local): every key missing on either side is not compared.
        """
        ...
