"""The launch step: create the run's machine, idempotently, and record every resource.

It serves a run in queued (first moved to provisioning, with the machine's name written
ahead of any cloud call) or in provisioning with nothing recorded yet. Every provider
launch is find-before-create by the run's marks; "try again later" is a message to itself
with a delay, and so is "the cloud is still creating it" (a RetryableError with code
budget.IN_PROGRESS: a provider never waits past the invocation's budget, shared/budget.py).
Waiting for the agent is the heartbeat-check's job (its deadlines).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from shared.budget import IN_PROGRESS, invocation_bound_s
from shared.clock import now
from shared.context import Context
from shared.errors import CapacityError, PermanentError, ProviderError, QuotaError, RetryableError
from shared.key_rotation import current_key_since
from shared.lifecycle import TERMINAL
from shared.log import get_logger, redact_text
from shared.models import (
    CloudResource,
    DatasetVersionRecord,
    RunAttempt,
    RunCandidate,
    RunRecord,
    RunState,
    StepMessage,
)
from shared.providers.base import Bootstrap, ComputeProvider, LaunchSpec, RunRef, scope_of
from shared.runs.candidates import attempt_lines, candidates_of, with_candidate
from shared.runs.events import event
from shared.runs.moves import fail_to_release, move
from shared.runs.org_backends import compute_for, ref_of, run_connection, storage_for
from shared.runs.resources import merge_resources
from shared.security import mint_agent_token
from shared.services.api import org_secrets
from shared.services.api.projects import check_stored_dataset
from shared.settings import AGENT_TOKEN_MAX_TTL_S
from shared.steps import Step
from shared.store import leases

EXPORT_MARGIN_S = 3600  # after the runtime limit: time to export, verify and release


def launch_spec(ctx: Context, run: RunRecord) -> LaunchSpec:
    """What the provider gets: the machine to make, and the run's limits, so it can refuse a launch it
    could not finish or clean up (credentials expiring first, credit too low)."""
    # A later candidate's machine (after refusals, perhaps a capacity wait) must work from its own create on.
    start = now() if run.attempts else (run.launched_at or now())
    until = start + timedelta(seconds=ctx.settings.provisioning_timeout_s + run.runtime_limit_s + EXPORT_MARGIN_S)
    return LaunchSpec(ref=ref_of(ctx, run), offer=run.offer, bootstrap=bootstrap_for(ctx, run),
                      price_limit_per_hour=run.price_limit_per_hour, runtime_limit_s=run.runtime_limit_s,
                      must_work_until=until)


def storage_access(ctx: Context, run: RunRecord, dataset: DatasetVersionRecord,
                   ttl_s: int) -> tuple[dict[str, str], frozenset[str]]:
    """The agent's storage environment for `ttl_s` (presigned URLs or keys: its dataset, adapter, merged model when
    asked, logs), and which of its variables are secret. At launch, and again at a restart's exchange
    (shared/services/api/boot.py), whose launch-time URLs may have expired while the machine was stopped."""
    validation = validation_dataset(ctx, run)
    env, secret = storage_for(ctx, run.org).agent_env(
        run.id, dataset.storage_key, ttl_s=ttl_s, merged=run.training.merged, checkpoints=run.training.keep_checkpoints,
        validation=validation.storage_key if validation else "")
    if validation is not None:
        env["TENSORANT_EVAL_DATASET_SHA256"] = validation.sha256  # the agent refuses another file, as the dataset's
    return env, secret


def validation_dataset(ctx: Context, run: RunRecord) -> DatasetVersionRecord | None:
    """The run's validation dataset version (validation_dataset_version_id), or None."""
    if not run.validation_dataset_version_id:
        return None
    return ctx.store.datasets.get(run.org, run.validation_dataset_version_id)


def bootstrap_for(ctx: Context, run: RunRecord) -> Bootstrap:
    settings = ctx.settings
    # Short-lived, renewed through heartbeats, so a leaked token dies soon; the first covers the image pull too.
    current_key_since(ctx)  # recorded before the first token on a new key (shared/key_rotation.py)
    token = mint_agent_token(run.org, run.id, ttl_s=min(settings.provisioning_timeout_s + settings.agent_token_ttl_s,
                                                        AGENT_TOKEN_MAX_TTL_S))
    dataset = ctx.store.datasets.get(run.org, run.dataset_version_id)
    # The object must still be the one validated (a volume or bucket may have changed it since):
    # refused with its reason if it changed.
    check_stored_dataset(ctx, run.org, dataset)
    validation = validation_dataset(ctx, run)
    if validation is not None:
        check_stored_dataset(ctx, run.org, validation)
    # Access must outlive the run: provisioning, the runtime limit, and an hour to export.
    ttl = settings.provisioning_timeout_s + run.runtime_limit_s + EXPORT_MARGIN_S
    storage_env, secret_keys = storage_access(ctx, run, dataset, ttl)
    env = {
        "TENSORANT_RUN_ID": run.id,
        "TENSORANT_API_URL": settings.public_url,
        "TENSORANT_RUN_TOKEN": token,
        "TENSORANT_BASE_MODEL": run.base_model,
        # A Hub model's commit id, pinned at create: the machine loads the revision whose shapes were checked.
        **({"TENSORANT_BASE_MODEL_REVISION": run.base_model_revision} if run.base_model_revision else {}),
        # The resolved settings (trial bounds applied); the agent hands them to the trainer.
        # The agent hashes what it downloads: an object replaced after this check is refused there too.
        "TENSORANT_DATASET_SHA256": dataset.sha256,
        # The agent's own bounds (machine/agent/guard.py): it stops and powers off by itself past these plus a
        # margin, when the control plane that should have stopped it is gone.
        "TENSORANT_RUNTIME_LIMIT_S": str(run.runtime_limit_s),
        **({"TENSORANT_DEADLINE_AT": str(int(run.deadlines.runtime_by.timestamp()))}
           if run.deadlines.runtime_by else {}),
        "TENSORANT_TRAINING": json.dumps(run.training.model_dump(mode="json"), sort_keys=True,
                                         separators=(",", ":")),
        **storage_env,
    }
    secret = {"TENSORANT_RUN_TOKEN", *secret_keys}
    tracking, tracking_secret = org_secrets.tracking_env(ctx, run.org)  # MLflow / W&B: the trainer's alone
    env.update(tracking)
    secret |= tracking_secret
    hf_token = org_secrets.hf_token(ctx, run.org)
    if hf_token:
        # For gated models; the agent gives it to the trainer only and masks it in forwarded logs.
        env["HF_TOKEN"] = hf_token
        secret.add("HF_TOKEN")
    if settings.trainer_command:
        # The operator's choice (tests: the smoke trainer); otherwise the machine's default
        # (the local provider: the real trainer; cloud: the container's agent default).
        env["TENSORANT_TRAINER_COMMAND"] = settings.trainer_command
    return Bootstrap(container_image=settings.container_image, env=env, secret_env_keys=frozenset(secret))


# A create that crashed or timed out may have made a machine that listing does not show
# yet (new instances are invisible to listing for a while), so find-before-create alone
# can create a second one. Each create attempt first claims the run (leases.claim_launch),
# and a claim is granted only launch_settle_s() after the previous one: the attempt that took it
# may still be inside its invocation (its create waits on the cloud for up to budget.step_budget_s,
# 80 s, within budget.invocation_bound_s, 100 s), and what it made may then be missing from listings
# for LISTING_LAG_S more (the 60 s this claim used to hold in all, under the create's own wait).
LISTING_LAG_S = 60.0


def launch_settle_s() -> float:
    """How long a launch claim holds: the claiming invocation's whole bound, then the listing lag."""
    return invocation_bound_s() + LISTING_LAG_S


def machine_up_at(run: RunRecord, resources: list[CloudResource], called_at: datetime) -> datetime:
    """When billing starts: the cloud's own creation time of the machine found (a launch retried after a
    crash finds the machine the first attempt made, up to a minute earlier), else this create call's time.
    A cloud time outside the run's launch and this call is another clock's, and not taken."""
    times = [r.created_at for r in resources if r.created_at is not None]
    first = min(times) if times else None
    if first is not None and run.launched_at is not None and run.launched_at <= first <= called_at:
        return first
    return called_at


def _claim(ctx: Context, msg: StepMessage) -> RunRecord | None:
    """The run this invocation launches its current candidate for, claimed; None when there is nothing to launch
    now (moved on, launched already, another attempt's claim is recent, or every candidate refused)."""
    run, _ = ctx.store.runs.get(msg.org, msg.run_id)
    if run.state not in Step.launch.serves:
        return None  # moved on (a duplicate or late delivery)
    claimed = False
    if run.state == RunState.queued:
        # Write-ahead: the run says which machine it owns before the cloud call (the first claim).
        run, claimed = move(ctx, run, RunState.provisioning, expect={RunState.queued}, machine_name=ref_of(ctx, run).name,
                            launch_claimed_at=now())
    if run.state != RunState.provisioning or run.resources:
        return None  # moved on, or launched already (duplicate delivery)
    # One machine per run across attempts: what a refused attempt may have made is confirmed gone first.
    if not _abandoned_released(ctx, run, msg):
        return None
    if run.candidate_index >= len(candidates_of(run)):
        _all_refused(ctx, run, msg)
        return None
    deadline = run.deadlines.provisioning_by
    if run.attempts and deadline and now() > deadline:
        fail_to_release(ctx, run, "no candidate launched before the provisioning deadline; the attempts:\n"
                        + attempt_lines(run.attempts))
        return None
    return run if claimed else _settled_claim(ctx, run, msg)


def _settled_claim(ctx: Context, run: RunRecord, msg: StepMessage) -> RunRecord | None:
    """A run already provisioning launches only when no other attempt claimed it within launch_settle_s()."""
    settle_s = launch_settle_s()
    run, claimed = leases.claim_launch(ctx, run.org, run.id, settle_s=settle_s)
    if run.state != RunState.provisioning or run.resources:
        return None
    if not claimed:  # another attempt is recent: its machine may not be listed yet
        ctx.queues.send(Step.launch, msg, delay_s=max(1.0, leases.launch_claim_left(run, settle_s)))
        return None
    return run


def _create(ctx: Context, run: RunRecord, msg: StepMessage, provider: ComputeProvider, candidate: RunCandidate,
            create_called_at: datetime) -> tuple[list[CloudResource], dict[str, str]] | None:
    """The cloud's create call for the candidate: its resources and scope; None when it did not launch (skipped
    or refused: the next candidate; retried later; or failed)."""
    refusal = _preflight_refusal(provider, candidate, ref_of(ctx, run))
    if refusal is not None:
        _next_candidate(ctx, run, msg, "skipped", "preflight", refusal, create_called_at, released=True)
        return None
    try:
        scope = scope_of(provider)  # where the machine is made: release and the sweeper act only there
        return provider.launch(launch_spec(ctx, run)), scope
    except RetryableError as exc:
        _retry_later(ctx, run, msg, exc)
    except (CapacityError, QuotaError) as exc:
        # The cloud has no capacity, quota or stock for this candidate: not the run's fault, so the next one.
        _refused(ctx, run, msg, provider, exc, create_called_at)
    except PermanentError as exc:
        # Anything else (credentials, image, subnet, a bootstrap that cannot be built) is a configuration
        # error: failover would hide it, so the run fails as with one candidate.
        get_logger().warning("launch failed permanently", extra={"reason": exc.reason})
        _record_failed(ctx, run, exc, create_called_at)
        fail_to_release(ctx, run, f"launch failed: {exc.reason}")
    return None


def _retry_later(ctx: Context, run: RunRecord, msg: StepMessage, exc: RetryableError) -> None:
    """Try again after the delay the cloud asked for, unless that passes the provisioning deadline."""
    deadline = run.deadlines.provisioning_by
    if deadline and now() + timedelta(seconds=exc.retry_after_s) > deadline:
        fail_to_release(ctx, run, f"launch kept failing until the provisioning deadline: {exc.reason}")
        return
    if exc.code == IN_PROGRESS:
        # Answered: the next claim waits for the listing lag from now, not the rest of this invocation's bound.
        leases.end_launch_claim(ctx, run, settle_s=launch_settle_s(), lag_s=LISTING_LAG_S)
        event(ctx, run, "audit", f"launch continues in {int(exc.retry_after_s)} s: {redact_text(exc.reason)}")
    else:
        event(ctx, run, "warning", f"launch will be retried: {redact_text(exc.reason)}")
    ctx.queues.send(Step.launch, msg, delay_s=exc.retry_after_s)


def launch(ctx: Context, msg: StepMessage) -> None:
    run = _claim(ctx, msg)
    if run is None:
        return
    candidate = candidates_of(run)[run.candidate_index]
    provider = compute_for(ctx, run.org, run_connection(run))
    create_called_at = now()  # billing counts from the create call: a cloud may bill from then
    created = _create(ctx, run, msg, provider, candidate, create_called_at)
    if created is None:
        return
    resources, scope = created
    run = _record_launch(ctx, run, provider, resources, scope, create_called_at)
    _after_launch(ctx, run, msg, provider, candidate, resources)


def _record_launch(ctx: Context, run: RunRecord, provider: ComputeProvider, resources: list[CloudResource], scope: dict[str, str],
                   create_called_at: datetime) -> RunRecord:
    """The machine's resources on the ledger and on the run, with the attempt and the deadlines it sets."""
    store = ctx.store
    for res in resources:
        store.ledger.record(res)
    up_at = machine_up_at(run, resources, create_called_at)
    launched = _attempt(run, "launched", "", "", create_called_at)
    timeout_s = ctx.settings.provisioning_timeout_s

    def change(r: RunRecord) -> RunRecord | None:
        merged = merge_resources(r.resources, resources)
        recorded = any(a.outcome == "launched" for a in r.attempts)
        if merged == r.resources and (r.scope or not scope) and recorded:
            return None
        # A machine that exchanges a bootstrap claim (cloud-init) must do so within minutes of its create
        # call: heartbeat-check releases it at first_report_by rather than at the whole boot deadline.
        first_s = getattr(provider, "first_report_s", 0)
        deadlines = r.deadlines
        if first_s and deadlines.first_report_by is None:
            deadlines = deadlines.model_copy(update={"first_report_by": create_called_at + timedelta(seconds=first_s)})
        if r.attempts and deadlines.provisioning_by is not None:
            # A later candidate's machine boots from its own create call: the refusals before it took
            # none of its boot allowance.
            boot_by = create_called_at + timedelta(seconds=timeout_s)
            deadlines = deadlines.model_copy(update={"provisioning_by": max(deadlines.provisioning_by, boot_by)})
        attempts = r.attempts if recorded or len(r.attempts) != launched.index else [*r.attempts, launched]
        return r.model_copy(update={"resources": merged, "scope": r.scope or scope, "updated_at": now(),
                                    "machine_up_at": r.machine_up_at or up_at, "deadlines": deadlines,
                                    "attempts": attempts})

    run, _ = store.runs.mutate(run.org, run.id, change)
    return run


def _after_launch(ctx: Context, run: RunRecord, msg: StepMessage, provider: ComputeProvider, candidate: RunCandidate,
                  resources: list[CloudResource]) -> None:
    """The machine's creation on the timeline; released again when the run moved on while the cloud created it."""
    several = len(run.attempts) > 1 or len(run.candidates) > 1
    on = f" on {candidate.connection} {candidate.offer.offer_id} ({candidate.offer.gpu}, " \
         f"{candidate.offer.total_per_hour:g} {candidate.offer.currency}/h)" if several else ""
    event(ctx, run, "audit", "machine created" + on + ": " + ", ".join(f"{r.kind} {r.id}" for r in resources))
    if run.state == RunState.releasing:
        # Its release may have looked before these resources existed: look again.
        ctx.queues.send(Step.release, msg)
    elif run.state in TERMINAL:
        # The run ended (cancelled, failed) while the cloud was still creating: release now rather
        # than leave the machine billing until the sweeper's grace period has passed.
        try:
            out = provider.release(ref_of(ctx, run), resources)
            detail = "released" if out.done else f"release started, not confirmed yet ({out.detail})"
        except ProviderError as exc:
            detail = f"release failed ({redact_text(exc.reason)}); the sweeper will retry"
        event(ctx, run, "audit", f"the machine was created after the run ended: {detail}")


# ---------------------------------------------------------------- failover (issue 37)
#
# A run's candidates are tried one per invocation, in order. A capacity, quota or stock refusal releases
# whatever the attempt made (confirmed), records the attempt, and sends the launch message again for the
# next candidate; the attempt's index is on the run before any cloud call of it (the count of attempts
# decided), and the marks of what it creates carry it, so a resumed invocation and the sweeper can tell an
# abandoned attempt's machine from the live one. When every candidate refused, the run waits
# (capacity_wait_s, backing off through queue delays) and tries the list again, or fails with one line
# per attempt.

# A run's record holds its attempts; past this many it fails rather than grow without bound.
MAX_ATTEMPTS = 48
CAPACITY_BACKOFF_S = (60, 120, 300, 600, 900)  # then 900 s between rounds
MESSAGE_CHARS = 300


def _preflight_refusal(provider: ComputeProvider, candidate: RunCandidate, ref: RunRef) -> str | None:
    """Why the candidate cannot be launched without asking the cloud to create anything (Azure usages,
    AWS Service Quotas), or None. A refusal skips the candidate with an event; it never fails the run.
    The provider's preflight is a read that never raises and never counts the run's own machine
    (`ref`: a repeated launch of this attempt)."""
    return provider.preflight(candidate.offer, ref)


def _attempt(run: RunRecord, outcome: str, code: str, message: str, started: datetime,
             released: bool = True) -> RunAttempt:
    c = candidates_of(run)[min(run.candidate_index, len(candidates_of(run)) - 1)]
    t = now()
    return RunAttempt(index=len(run.attempts), connection=c.connection, provider=c.offer.provider,
                      offer_id=c.offer.offer_id, gpu=c.offer.gpu, price_per_hour=c.offer.total_per_hour,
                      started_at=started, ended_at=t, outcome=outcome,  # type: ignore[arg-type]
                      code=code[:64], message=redact_text(message)[:MESSAGE_CHARS],
                      seconds=round(max(0.0, (t - started).total_seconds()), 3), released=released)


def _record_failed(ctx: Context, run: RunRecord, exc: ProviderError, started: datetime) -> None:
    attempt = _attempt(run, "failed", exc.code, exc.reason, started)

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.provisioning or r.resources or len(r.attempts) != attempt.index:
            return None
        return r.model_copy(update={"attempts": [*r.attempts, attempt], "updated_at": now()})

    ctx.store.runs.mutate(run.org, run.id, change)


def _refused(ctx: Context, run: RunRecord, msg: StepMessage, provider: ComputeProvider, exc: ProviderError,
             started: datetime) -> None:
    """Release what the refused attempt made (an Azure NIC or failed VM, an instance that went pending ->
    terminated), then move on. A release not confirmed yet is finished by the next invocation first."""
    try:
        released = provider.release(ref_of(ctx, run), []).done
    except ProviderError as err:
        get_logger().warning("release of a refused attempt failed", extra={"reason": err.reason})
        released = False
    _next_candidate(ctx, run, msg, "refused", exc.code or type(exc).__name__, exc.reason, started, released=released)


def _next_candidate(ctx: Context, run: RunRecord, msg: StepMessage, outcome: str, code: str, message: str, started: datetime,
                    *, released: bool) -> None:
    attempt = _attempt(run, outcome, code, message, started, released)
    nxt = run.candidate_index + 1
    count = len(candidates_of(run))

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.provisioning or r.resources or len(r.attempts) != attempt.index:
            return None  # a duplicate delivery decided this attempt already
        # The refused create was answered, and the next attempt's marks differ from this one's: nothing of
        # it can hide from the next find-before-create, so the next claim is due at once.
        update: dict[str, Any] = {"attempts": [*r.attempts, attempt], "updated_at": now(),
                                  "launch_claimed_at": now() - timedelta(seconds=launch_settle_s())}
        update |= with_candidate(r, nxt) if nxt < count else {"candidate_index": nxt}
        moved = r.model_copy(update=update)
        return moved.model_copy(update={"machine_name": ref_of(ctx, moved).name})

    run, wrote = ctx.store.runs.mutate(run.org, run.id, change)
    if not wrote:
        return
    after = (f"trying candidate {nxt + 1} of {count}: {run.connection or run.provider} {run.offer.offer_id} "
             f"({run.offer.gpu}, {run.offer.total_per_hour:g} {run.offer.currency}/h)") if nxt < count \
        else "every candidate refused"
    event(ctx, run, "warning", f"attempt {attempt.index + 1} on {attempt.connection} {attempt.offer_id} ({attempt.gpu}) "
          f"{outcome}: {attempt.code}: {attempt.message}; {after}", type="run.attempt_refused",
          attempt=attempt.index, connection=attempt.connection, provider=attempt.provider,
          offer_id=attempt.offer_id, outcome=outcome, code=attempt.code, seconds=attempt.seconds)
    ctx.queues.send(Step.launch, msg)


def _abandoned_released(ctx: Context, run: RunRecord, msg: StepMessage) -> bool:
    """Whether every refused attempt's resources are confirmed gone; releases them (by their attempt's
    marks) when not, and sends the launch message again while the cloud has not confirmed."""
    pending = [a for a in run.attempts if not a.released]
    if not pending:
        return True
    waiting = []
    for a in pending:
        try:
            out = compute_for(ctx, run.org, a.connection).release(ref_of(ctx, run, a.index), [])
        except ProviderError as exc:
            waiting.append(f"attempt {a.index + 1}: {redact_text(exc.reason)}")
            continue
        if not out.done:
            waiting.append(f"attempt {a.index + 1}: {out.detail}")
            continue
        run, _ = ctx.store.runs.mutate(run.org, run.id, _mark_released(a.index))
    if not waiting:
        return True
    deadline = run.deadlines.provisioning_by
    if deadline and now() > deadline:
        # The run ends; the sweeper releases what the attempt left (its marks name the attempt).
        fail_to_release(ctx, run, "no candidate launched before the provisioning deadline, and the cloud has not "
                        "confirmed the release of " + "; ".join(waiting) + "; the attempts:\n"
                        + attempt_lines(run.attempts))
        return False
    event(ctx, run, "audit", "waiting for the cloud to confirm the release of " + "; ".join(waiting),
          source="attempt-release")
    ctx.queues.send(Step.launch, msg, delay_s=15.0)
    return False


def _mark_released(index: int) -> Callable[[RunRecord], RunRecord | None]:
    def change(r: RunRecord) -> RunRecord | None:
        if index >= len(r.attempts) or r.attempts[index].released:
            return None
        attempts = list(r.attempts)
        attempts[index] = attempts[index].model_copy(update={"released": True})
        return r.model_copy(update={"attempts": attempts, "updated_at": now()})

    return change


def _all_refused(ctx: Context, run: RunRecord, msg: StepMessage) -> None:
    """Every candidate refused in this round: wait and try the list again while capacity_wait_s allows,
    else fail with one line per attempt."""
    t = now()
    since = run.capacity_wait_since or t
    count = len(candidates_of(run))
    rounds = max(1, len(run.attempts) // max(1, count))
    delay = CAPACITY_BACKOFF_S[min(rounds - 1, len(CAPACITY_BACKOFF_S) - 1)]
    until = since + timedelta(seconds=run.capacity_wait_s)
    if run.capacity_wait_s > 0 and t + timedelta(seconds=delay) <= until and len(run.attempts) + count <= MAX_ATTEMPTS:
        settings = ctx.settings

        def change(r: RunRecord) -> RunRecord | None:
            if r.state != RunState.provisioning or r.resources or r.candidate_index < count:
                return None
            d = r.deadlines
            # Nothing bills while the run waits: its boot and runtime deadlines start after the wait.
            shift: dict[str, Any] = {"provisioning_by": max(d.provisioning_by or t, t + timedelta(
                seconds=delay + settings.provisioning_timeout_s))}
            if d.runtime_by is not None:
                shift["runtime_by"] = max(d.runtime_by, t + timedelta(seconds=delay + r.runtime_limit_s))
            moved = r.model_copy(update={
                **with_candidate(r, 0), "capacity_wait_since": since, "updated_at": t,
                "deadlines": d.model_copy(update=shift),
                # The next claim (the next round's first create) is due after the delay.
                "launch_claimed_at": t + timedelta(seconds=delay - launch_settle_s())})
            return moved.model_copy(update={"machine_name": ref_of(ctx, moved).name})

        run, wrote = ctx.store.runs.mutate(run.org, run.id, change)
        if wrote:
            event(ctx, run, "audit", f"every candidate refused; trying them again in {delay // 60} min (capacity_wait_s: "
                  f"until {until.strftime('%H:%M UTC')})", source="capacity-wait", delay_s=delay)
            ctx.queues.send(Step.launch, msg, delay_s=float(delay))
        return
    waited = f" (waited for capacity since {since.strftime('%H:%M UTC')})" if run.capacity_wait_since else ""
    fail_to_release(ctx, run, f"every candidate refused{waited}; the attempts:\n" + attempt_lines(run.attempts))
