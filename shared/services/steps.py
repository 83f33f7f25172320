"""The queue-triggered run steps: launch, verify-adapter, retain, release.

Each is idempotent: it acts only when the run is in the state the step serves, and
every cloud call it makes is idempotent per run (find by marks before creating;
"not found" on delete is success). Waiting is a message to itself with a delay.
"""

from __future__ import annotations

import sys
from datetime import timedelta

from shared.clock import now
from shared.log import get_logger, redact_text
from shared.models import CloudResource, Outcome, RunRecord, RunState, StepMessage
from shared.providers.base import Bootstrap, LaunchSpec
from shared.providers.errors import PermanentError, ProviderError, RetryableError
from shared.queues import Queue, get_queues
from shared.runs.lifecycle import TERMINAL, transition
from shared.security import mint_agent_token
from shared.services.common import compute_for, event, ref_of, storage_for, transition_event
from shared.settings import get_settings
from shared.storage.base import ObjectMissing, adapter_key
from shared.store import get_store

MAX_ADAPTER_BYTES = 1024 * 1024 * 1024


def _move(run: RunRecord, target: RunState, *, expect: set[RunState], reason: str | None = None,
          outcome: Outcome | None = None, **updates: object) -> tuple[RunRecord, bool]:
    """Guarded transition: only from one of `expect`; returns (run now, whether this call moved it)."""

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in expect:
            return None
        moved = transition(r, target, reason=reason, outcome=outcome)
        return moved.model_copy(update=updates) if updates else moved

    new, wrote = get_store().mutate_run(run.org, run.id, change)
    if wrote:
        transition_event(run.state, new)
    return new, wrote


def _fail_to_release(run: RunRecord, reason: str) -> None:
    # Redacted: a provider's error text may echo the request (the bootstrap's token and keys).
    run, _ = _move(run, RunState.releasing, expect={run.state}, reason=redact_text(reason), outcome=Outcome.failed)
    get_queues().send(Queue.release, StepMessage(org=run.org, run_id=run.id))


def _merge(existing: list[CloudResource], new: list[CloudResource]) -> list[CloudResource]:
    by_key = {(r.kind, r.id): r for r in existing}
    by_key.update({(r.kind, r.id): r for r in new})
    return list(by_key.values())


def bootstrap_for(run: RunRecord) -> Bootstrap:
    settings = get_settings()
    token = mint_agent_token(run.org, run.id)
    dataset = get_store().get_dataset(run.org, run.dataset_version_id)
    # Access must outlive the run: provisioning, the runtime limit, and an hour to export.
    ttl = settings.provisioning_timeout_s + run.runtime_limit_s + 3600
    storage_env, secret_keys = storage_for(run.org).agent_env(run.id, dataset.storage_key, ttl_s=ttl)
    env = {
        "TENSORANT_RUN_ID": run.id,
        "TENSORANT_API_URL": settings.public_url,
        "TENSORANT_RUN_TOKEN": token,
        "TENSORANT_BASE_MODEL": run.base_model,
        **storage_env,
    }
    if settings.trainer_command:
        env["TENSORANT_TRAINER_COMMAND"] = settings.trainer_command
    elif run.provider == "local":
        env["TENSORANT_TRAINER_COMMAND"] = f"{sys.executable} -m shared.trainer.smoke"
    return Bootstrap(container_image=settings.container_image, env=env,
                     secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN", *secret_keys}))


# ------------------------------------------------------------------ launch


# A create that crashed or timed out may have made a machine that listing does not show
# yet (LESSONS.md: new instances are invisible for a while), so find-before-create alone
# can create a second one. Each create attempt first claims the run (an ETag-guarded write
# of updated_at), and a claim is granted only this long after the previous one.
LAUNCH_SETTLE_S = 60


def _claim_launch(run: RunRecord) -> tuple[RunRecord, bool]:
    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.provisioning or r.resources:
            return None
        if (now() - r.updated_at).total_seconds() < LAUNCH_SETTLE_S:
            return None
        return r.model_copy(update={"updated_at": now()})

    return get_store().mutate_run(run.org, run.id, change)


def launch(msg: StepMessage) -> None:
    store = get_store()
    run, _ = store.get_run(msg.org, msg.run_id)
    claimed = False
    if run.state == RunState.queued:
        # Write-ahead: the run says which machine it owns before the cloud call (the first claim).
        run, claimed = _move(run, RunState.provisioning, expect={RunState.queued}, machine_name=ref_of(run).name)
    if run.state != RunState.provisioning or run.resources:
        return  # moved on, or launched already (duplicate delivery)
    if not claimed:
        run, claimed = _claim_launch(run)
        if run.state != RunState.provisioning or run.resources:
            return
        if not claimed:  # another attempt is recent: its machine may not be listed yet
            wait = LAUNCH_SETTLE_S - (now() - run.updated_at).total_seconds()
            get_queues().send(Queue.launch, msg, delay_s=max(1.0, wait))
            return
    log = get_logger()
    provider = compute_for(run.org, run.provider)
    try:
        resources = provider.launch(LaunchSpec(ref=ref_of(run), offer=run.offer, bootstrap=bootstrap_for(run)))
    except RetryableError as exc:
        deadline = run.deadlines.provisioning_by
        if deadline and now() + timedelta(seconds=exc.retry_after_s) > deadline:
            _fail_to_release(run, f"launch kept failing until the provisioning deadline: {exc.reason}")
            return
        event(run, "warning", f"launch will be retried: {redact_text(exc.reason)}")
        get_queues().send(Queue.launch, msg, delay_s=exc.retry_after_s)
        return
    except PermanentError as exc:
        log.warning("launch failed permanently", extra={"reason": exc.reason})
        _fail_to_release(run, f"launch failed: {exc.reason}")
        return
    for res in resources:
        store.record_resource(res)

    def change(r: RunRecord) -> RunRecord | None:
        merged = _merge(r.resources, resources)
        return None if merged == r.resources else r.model_copy(update={"resources": merged, "updated_at": now()})

    run, _ = store.mutate_run(run.org, run.id, change)
    event(run, "audit", "machine created: " + ", ".join(f"{r.kind} {r.id}" for r in resources))
    if run.state == RunState.releasing:
        # Its release may have looked before these resources existed: look again.
        get_queues().send(Queue.release, msg)
    elif run.state in TERMINAL:
        # The run ended (cancelled, failed) while the cloud was still creating: release now rather
        # than leave the machine billing until the sweeper's grace period has passed.
        try:
            out = provider.release(ref_of(run), resources)
            detail = "released" if out.done else f"release started, not confirmed yet ({out.detail})"
        except ProviderError as exc:
            detail = f"release failed ({redact_text(exc.reason)}); the sweeper will retry"
        event(run, "audit", f"the machine was created after the run ended: {detail}")


# ------------------------------------------------------------------ verify-adapter


def verify(msg: StepMessage) -> None:
    from shared.adapters.verify import verify_adapter

    run, _ = get_store().get_run(msg.org, msg.run_id)
    if run.state not in (RunState.verifying, RunState.recovering):
        return
    key = adapter_key(run.id)
    try:
        data = storage_for(run.org).get(key, MAX_ADAPTER_BYTES)
        result = verify_adapter(data, base_model=run.base_model, expected_sha256=run.adapter_sha256 or None)
        problems = list(result.problems)
    except ObjectMissing:
        problems = [f"no adapter archive at {key} in storage"]
    except ValueError as exc:
        problems = [str(exc)]
    if not problems:
        run, _ = _move(run, RunState.releasing, expect={run.state}, reason="adapter verified",
                       outcome=Outcome.succeeded)
        event(run, "audit", "adapter verified", sha256=run.adapter_sha256)
        get_queues().send(Queue.release, StepMessage(org=run.org, run_id=run.id))
        return
    why = "adapter verification failed: " + "; ".join(problems)
    if run.state == RunState.recovering:
        _move(run, RunState.retained, expect={RunState.recovering}, reason=why + "; the machine and disk are still "
              "retained, so fix the archive and recover again, or cancel with discard")
        return
    run, _ = _move(run, RunState.retaining, expect={RunState.verifying}, reason=why)
    get_queues().send(Queue.retain, StepMessage(org=run.org, run_id=run.id))


# ------------------------------------------------------------------ retain


def retain(msg: StepMessage) -> None:
    from shared.models import MachineState

    run, _ = get_store().get_run(msg.org, msg.run_id)
    if run.state != RunState.retaining:
        return
    provider = compute_for(run.org, run.provider)
    ref = ref_of(run)
    resources = _merge(get_store().list_ledger(run.id), run.resources)
    # Asked even with nothing recorded: a launch that crashed between the cloud call and the
    # record leaves a machine only its marks can find (every provider describes by the ref).
    desc = provider.describe(ref, resources)
    resources = _merge(resources, list(desc.resources))
    if desc.state == MachineState.gone:
        # Vanished outside the control plane (or never created): nothing to stop, nothing to keep.
        reason = ("the machine is gone (deleted outside the control plane or never created); "
                  "nothing to retain or release. " + run.reason)
        run, _ = _move(run, RunState.releasing, expect={RunState.retaining}, reason=reason, outcome=Outcome.failed)
        get_queues().send(Queue.release, StepMessage(org=run.org, run_id=run.id))
        return
    try:
        out = provider.retain(ref, resources)
    except ProviderError as exc:
        event(run, "warning", f"stopping the machine failed: {exc.reason}; it may still be billing")
        raise
    if not out.done:
        get_queues().send(Queue.retain, msg, delay_s=out.retry_after_s)
        return
    _move(run, RunState.retained, expect={RunState.retaining}, billing_note=out.billing_note)


# ------------------------------------------------------------------ release


def release_delay(attempts: int) -> float:
    return float(min(get_settings().release_backoff_max_s, 15 * 2 ** min(attempts, 10)))


def release(msg: StepMessage) -> None:
    store = get_store()
    run, _ = store.get_run(msg.org, msg.run_id)
    if run.state != RunState.releasing:
        return
    resources = _merge(store.list_ledger(run.id), run.resources)
    try:
        out = compute_for(run.org, run.provider).release(ref_of(run), resources)
        detail = out.detail
    except ProviderError as exc:
        out, detail = None, exc.reason
    if out is not None and out.done:
        for res in resources:
            store.record_resource(res.model_copy(update={"state": "deleted"}))
        target = RunState(run.outcome.value) if run.outcome else RunState.failed
        _move(run, target, expect={RunState.releasing}, release_error="", billing_note="")
        return
    attempts = run.release_attempts + 1
    delay = out.retry_after_s if out is not None and attempts < 4 else release_delay(attempts)

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.releasing:
            return None
        return r.model_copy(update={"release_attempts": attempts, "release_error": detail, "updated_at": now(),
                                    "release_after": now() + timedelta(seconds=delay)})

    run, wrote = store.mutate_run(run.org, run.id, change)
    if wrote and out is None:
        event(run, "warning", f"release attempt {attempts} failed: {detail}; retrying in {int(delay)} s")
    get_queues().send(Queue.release, msg, delay_s=delay)
