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
from datetime import datetime, timedelta

from shared.budget import IN_PROGRESS
from shared.clock import now
from shared.errors import PermanentError, ProviderError, RetryableError
from shared.key_rotation import current_key_since
from shared.lifecycle import TERMINAL
from shared.log import get_logger, redact_text
from shared.models import CloudResource, DatasetVersionRecord, RunRecord, RunState, StepMessage
from shared.providers.base import Bootstrap, LaunchSpec, scope_of
from shared.queues import get_queues
from shared.runs.events import event
from shared.runs.moves import fail_to_release, move
from shared.runs.org_backends import compute_for, ref_of, storage_for
from shared.runs.resources import merge_resources
from shared.security import mint_agent_token
from shared.services.api import org_secrets
from shared.services.api.projects import check_stored_dataset
from shared.settings import AGENT_TOKEN_MAX_TTL_S, get_settings
from shared.steps import Step
from shared.store import get_store

EXPORT_MARGIN_S = 3600  # after the runtime limit: time to export, verify and release


def launch_spec(run: RunRecord) -> LaunchSpec:
    """What the provider gets: the machine to make, and the run's limits, so it can refuse a launch it
    could not finish or clean up (credentials expiring first, credit too low)."""
    start = run.launched_at or now()
    until = start + timedelta(seconds=get_settings().provisioning_timeout_s + run.runtime_limit_s + EXPORT_MARGIN_S)
    return LaunchSpec(ref=ref_of(run), offer=run.offer, bootstrap=bootstrap_for(run),
                      price_limit_per_hour=run.price_limit_per_hour, runtime_limit_s=run.runtime_limit_s,
                      must_work_until=until)


def storage_access(run: RunRecord, dataset: DatasetVersionRecord,
                   ttl_s: int) -> tuple[dict[str, str], frozenset[str]]:
    """The agent's storage environment for `ttl_s` (presigned URLs or keys: its dataset, adapter, merged model when
    asked, logs), and which of its variables are secret. At launch, and again at a restart's exchange
    (shared/services/api/boot.py), whose launch-time URLs may have expired while the machine was stopped."""
    return storage_for(run.org).agent_env(run.id, dataset.storage_key, ttl_s=ttl_s, merged=run.training.merged)


def bootstrap_for(run: RunRecord) -> Bootstrap:
    settings = get_settings()
    # Short-lived, renewed through heartbeats, so a leaked token dies soon; the first covers the image pull too.
    current_key_since()  # recorded before the first token on a new key (shared/key_rotation.py)
    token = mint_agent_token(run.org, run.id, ttl_s=min(settings.provisioning_timeout_s + settings.agent_token_ttl_s,
                                                        AGENT_TOKEN_MAX_TTL_S))
    dataset = get_store().datasets.get(run.org, run.dataset_version_id)
    # The object must still be the one validated (a volume or bucket may have changed it since):
    # refused with its reason if it changed.
    check_stored_dataset(run.org, dataset)
    # Access must outlive the run: provisioning, the runtime limit, and an hour to export.
    ttl = settings.provisioning_timeout_s + run.runtime_limit_s + EXPORT_MARGIN_S
    storage_env, secret_keys = storage_access(run, dataset, ttl)
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
    hf_token = org_secrets.hf_token(run.org)
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
# can create a second one. Each create attempt first claims the run (store.runs.claim_launch),
# and a claim is granted only this long after the previous one.
LAUNCH_SETTLE_S = 60


def machine_up_at(run: RunRecord, resources: list[CloudResource], called_at: datetime) -> datetime:
    """When billing starts: the cloud's own creation time of the machine found (a launch retried after a
    crash finds the machine the first attempt made, up to a minute earlier), else this create call's time.
    A cloud time outside the run's launch and this call is another clock's, and not taken."""
    times = [r.created_at for r in resources if r.created_at is not None]
    first = min(times) if times else None
    if first is not None and run.launched_at is not None and run.launched_at <= first <= called_at:
        return first
    return called_at


def launch(msg: StepMessage) -> None:
    store = get_store()
    run, _ = store.runs.get(msg.org, msg.run_id)
    if run.state not in Step.launch.serves:
        return  # moved on (a duplicate or late delivery)
    claimed = False
    if run.state == RunState.queued:
        # Write-ahead: the run says which machine it owns before the cloud call (the first claim).
        run, claimed = move(run, RunState.provisioning, expect={RunState.queued}, machine_name=ref_of(run).name,
                            launch_claimed_at=now())
    if run.state != RunState.provisioning or run.resources:
        return  # moved on, or launched already (duplicate delivery)
    if not claimed:
        run, claimed = store.runs.claim_launch(run.org, run.id, settle_s=LAUNCH_SETTLE_S)
        if run.state != RunState.provisioning or run.resources:
            return
        if not claimed:  # another attempt is recent: its machine may not be listed yet
            wait = LAUNCH_SETTLE_S - (now() - (run.launch_claimed_at or run.updated_at)).total_seconds()
            get_queues().send(Step.launch, msg, delay_s=max(1.0, wait))
            return
    log = get_logger()
    provider = compute_for(run.org, run.provider)
    create_called_at = now()  # billing counts from the create call: a cloud may bill from then
    try:
        scope = scope_of(provider)  # where the machine is made: release and the sweeper act only there
        resources = provider.launch(launch_spec(run))
    except RetryableError as exc:
        deadline = run.deadlines.provisioning_by
        if deadline and now() + timedelta(seconds=exc.retry_after_s) > deadline:
            fail_to_release(run, f"launch kept failing until the provisioning deadline: {exc.reason}")
            return
        if exc.code == IN_PROGRESS:
            event(run, "audit", f"launch continues in {int(exc.retry_after_s)} s: {redact_text(exc.reason)}")
        else:
            event(run, "warning", f"launch will be retried: {redact_text(exc.reason)}")
        get_queues().send(Step.launch, msg, delay_s=exc.retry_after_s)
        return
    except PermanentError as exc:
        log.warning("launch failed permanently", extra={"reason": exc.reason})
        fail_to_release(run, f"launch failed: {exc.reason}")
        return
    for res in resources:
        store.ledger.record(res)
    up_at = machine_up_at(run, resources, create_called_at)

    def change(r: RunRecord) -> RunRecord | None:
        merged = merge_resources(r.resources, resources)
        if merged == r.resources and (r.scope or not scope):
            return None
        # A machine that exchanges a bootstrap claim (cloud-init) must do so within minutes of its create
        # call: heartbeat-check releases it at first_report_by rather than at the whole boot deadline.
        first_s = getattr(provider, "first_report_s", 0)
        deadlines = r.deadlines
        if first_s and deadlines.first_report_by is None:
            deadlines = deadlines.model_copy(update={"first_report_by": create_called_at + timedelta(seconds=first_s)})
        return r.model_copy(update={"resources": merged, "scope": r.scope or scope, "updated_at": now(),
                                    "machine_up_at": r.machine_up_at or up_at, "deadlines": deadlines})

    run, _ = store.runs.mutate(run.org, run.id, change)
    event(run, "audit", "machine created: " + ", ".join(f"{r.kind} {r.id}" for r in resources))
    if run.state == RunState.releasing:
        # Its release may have looked before these resources existed: look again.
        get_queues().send(Step.release, msg)
    elif run.state in TERMINAL:
        # The run ended (cancelled, failed) while the cloud was still creating: release now rather
        # than leave the machine billing until the sweeper's grace period has passed.
        try:
            out = provider.release(ref_of(run), resources)
            detail = "released" if out.done else f"release started, not confirmed yet ({out.detail})"
        except ProviderError as exc:
            detail = f"release failed ({redact_text(exc.reason)}); the sweeper will retry"
        event(run, "audit", f"the machine was created after the run ended: {detail}")
