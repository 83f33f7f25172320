"""User-facing run operations: draft, launch, get/list/logs, cancel, recover, retry release."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from shared.clock import now
from shared.errors import Conflict, InvalidInput
from shared.log import redact_text
from shared.models import (
    Deadlines,
    Outcome,
    Role,
    RunCancel,
    RunCreate,
    RunLaunch,
    RunRecord,
    RunRecover,
    RunState,
    RunView,
    StepMessage,
)
from shared.providers.errors import ProviderError
from shared.queues import get_queues
from shared.runs.lifecycle import ACTIVE, TERMINAL, transition
from shared.runs.steps import Step
from shared.security import Principal, require
from shared.services import quotas
from shared.services.backends import compute_for, compute_slot, ref_of, storage_for
from shared.services.catalog import find_offer
from shared.services.projects import new_id
from shared.services.run_events import event, transition_event
from shared.settings import get_settings
from shared.storage.base import adapter_key
from shared.store import get_store

MAX_UPLOAD = 1024 * 1024 * 1024


def view(run: RunRecord, with_events: bool = True) -> RunView:
    events = [e for e in get_store().list_events(run.id) if e.kind != "log"] if with_events else []
    return RunView(
        id=run.id, org=run.org, project_id=run.project_id, kind=run.kind, provider=run.provider, state=run.state,
        outcome=run.outcome, phase=run.phase, progress=run.progress, reason=run.reason, billing_note=run.billing_note,
        offer=run.offer, estimate_per_hour=run.offer.total_per_hour, price_limit_per_hour=run.price_limit_per_hour,
        runtime_limit_s=run.runtime_limit_s, base_model=run.base_model, dataset_version_id=run.dataset_version_id,
        resources=run.resources, adapter_sha256=run.adapter_sha256, release_error=run.release_error,
        release_attempts=run.release_attempts, created_at=run.created_at, updated_at=run.updated_at, events=events,
    )


def create(principal: Principal, body: RunCreate) -> RunView:
    require(principal, Role.owner, Role.member)
    quotas.check_create(principal, body)  # 11.8: org limits and the run rate limit
    store = get_store()
    store.get_project(principal.org, body.project_id)
    dataset = store.get_dataset(principal.org, body.dataset_version_id)
    if dataset.project_id != body.project_id:
        raise InvalidInput.field("dataset_version_id", "this dataset version belongs to another project")
    if store.get_connection(principal.org, compute_slot(body.provider)) is None:
        raise InvalidInput.field("provider", f"no {body.provider} compute connection is saved; an owner saves it first")
    offer = find_offer(principal.org, body.provider, body.offer_id)
    t = now()
    run = RunRecord(
        org=principal.org, id=new_id("r"), project_id=body.project_id, kind=body.kind, provider=body.provider,
        offer=offer, price_limit_per_hour=body.price_limit_per_hour,
        runtime_limit_s=body.runtime_limit_s or get_settings().default_runtime_limit_s,
        dataset_version_id=body.dataset_version_id, base_model=body.base_model, created_at=t, updated_at=t,
        state_changed_at=t, created_by=principal.sub,
    )
    store.create_run(run)
    event(run, "transition", "draft saved; nothing is rented until launch",
          estimate_per_hour=offer.total_per_hour)
    return view(run)


def get(principal: Principal, run_id: str) -> RunView:
    run, _ = get_store().get_run(principal.org, run_id)
    return view(run)


def list_runs(principal: Principal) -> dict[str, Any]:
    runs = sorted(get_store().list_runs(principal.org), key=lambda r: r.created_at, reverse=True)
    return {"items": [view(r, with_events=False) for r in runs]}


def logs(principal: Principal, run_id: str) -> dict[str, Any]:
    get_store().get_run(principal.org, run_id)
    lines = [line for e in get_store().list_events(run_id, kind="log") for line in e.data.get("lines", [])]
    return {"lines": lines}


def launch(principal: Principal, run_id: str, body: RunLaunch) -> RunView:
    require(principal, Role.owner, Role.member)
    if not body.confirm:
        raise InvalidInput.field("confirm", "launching rents a GPU billed to your account; send confirm: true")
    store = get_store()
    run, _ = store.get_run(principal.org, run_id)
    if run.state != RunState.draft:
        return view(run)  # launched already: a repeated click changes nothing
    quotas.check_launch(principal, run)  # 11.8: org limits, active runs and the rate limit
    offer = find_offer(principal.org, run.provider, run.offer.offer_id)
    if offer.total_per_hour > run.price_limit_per_hour:
        raise Conflict(f"the offer now costs {offer.total_per_hour:.4f}/h, above the run's limit of "
                       f"{run.price_limit_per_hour:.4f}/h; raise price_limit_per_hour or choose another offer")
    compute_for(principal.org, run.provider, require_connected=True)
    t = now()

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.draft:
            return None
        r = transition(r, RunState.queued, reason="")
        limits = get_settings()
        return r.model_copy(update={
            "offer": offer,  # the price at launch is what the run records
            "launched_at": t,
            "deadlines": Deadlines(provisioning_by=t + timedelta(seconds=limits.provisioning_timeout_s),
                                   runtime_by=t + timedelta(seconds=r.runtime_limit_s)),
        })

    run, wrote = store.mutate_run(principal.org, run_id, change)
    if wrote:
        transition_event(RunState.draft, run)
    # Sent after the write: a crash in between leaves a queued run that heartbeat-check re-sends.
    get_queues().send(Step.launch, StepMessage(org=run.org, run_id=run.id))
    return view(run)


def cancel(principal: Principal, run_id: str, body: RunCancel) -> RunView:
    require(principal, Role.owner, Role.member)
    store = get_store()

    def plan(state: RunState) -> tuple[RunState, Outcome | None, Step | None]:
        if state == RunState.draft:
            return RunState.cancelled, None, None
        if body.discard or state == RunState.queued:
            # A queued run has no machine yet (launch writes provisioning before any cloud
            # call), so there is no disk to keep: it is released (nothing) and cancelled.
            return RunState.releasing, Outcome.cancelled, Step.release
        if state in ACTIVE or state == RunState.verifying:
            return RunState.retaining, None, Step.retain
        raise Conflict(f"the run is {state.value}; cancel with discard: true to release its machine and disk")

    seen: list[RunState] = []
    sent: list[Step] = []

    def change(r: RunRecord) -> RunRecord | None:
        # Decided from the run as stored now: a step may have moved it since the user saw it
        # (queued -> provisioning), and the cancel must still apply to where it is.
        seen[:], sent[:] = [r.state], []
        if r.state in TERMINAL or r.state == RunState.releasing:
            return None
        target, outcome, queue = plan(r.state)
        if queue is not None:
            sent.append(queue)
        return transition(r, target, reason=f"cancelled by {principal.sub}", outcome=outcome)

    new, wrote = store.mutate_run(principal.org, run_id, change)
    if wrote:
        transition_event(seen[0], new)
        # Sent after the write: a crash in between leaves retaining to heartbeat-check's
        # re-send and releasing to the sweeper.
        for queue in sent:
            get_queues().send(queue, StepMessage(org=new.org, run_id=new.id))
    return view(new)


def recover(principal: Principal, run_id: str, upload: bytes | None, body: RunRecover | None) -> RunView:
    """Recover a retained run: verify an uploaded adapter, verify the saved one, or start the machine."""
    require(principal, Role.owner, Role.member)
    store = get_store()
    run, _ = store.get_run(principal.org, run_id)
    if run.state == RunState.recovering:
        return view(run)
    if run.state != RunState.retained:
        raise Conflict(f"only a retained run can be recovered; this one is {run.state.value}")
    mode = "upload" if upload is not None else (body.mode if body else "verify_saved")
    if mode == "start_machine":
        try:
            outcome = compute_for(run.org, run.provider).start(ref_of(run), run.resources)
        except ProviderError as exc:
            raise Conflict(f"the cloud refused to start the machine: {redact_text(exc.reason)}; the run stays "
                           "retained: try mode start_machine again later, or recover with mode verify_saved or "
                           "an adapter.zip upload") from exc
        note = outcome.billing_note or "the machine is starting: GPU billing resumes, training does not"
        event(run, "audit", f"machine start requested for recovery: {note}", detail=outcome.detail)

        def note_billing(r: RunRecord) -> RunRecord | None:
            return r.model_copy(update={"billing_note": note, "updated_at": now()}) if r.state == RunState.retained else None

        return view(store.mutate_run(run.org, run.id, note_billing)[0])
    sha = ""
    if upload is not None:
        if not upload:
            raise InvalidInput.field("body", "the upload is empty; send the adapter.zip bytes")
        if len(upload) > MAX_UPLOAD:
            raise InvalidInput.field("body", "the upload is over 1 GiB; that is not a LoRA adapter archive")
        storage_for(run.org).put(adapter_key(run.id), upload)
        sha = hashlib.sha256(upload).hexdigest()

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.retained:
            return None
        r = transition(r, RunState.recovering, reason=f"recovery: {'uploaded adapter' if sha else 'saved adapter'}")
        return r.model_copy(update={"adapter_sha256": sha}) if sha else r

    new, wrote = store.mutate_run(run.org, run.id, change)
    if wrote:
        transition_event(RunState.retained, new)
    get_queues().send(Step.verify_adapter, StepMessage(org=new.org, run_id=new.id, reason="recovery"))
    return view(new)


def retry_release(principal: Principal, run_id: str) -> RunView:
    require(principal, Role.owner, Role.member)
    run, _ = get_store().get_run(principal.org, run_id)
    if run.state != RunState.releasing:
        raise Conflict(f"only a run in releasing can retry its release; this one is {run.state.value}")
    event(run, "audit", f"release retry requested by {principal.sub}")
    get_queues().send(Step.release, StepMessage(org=run.org, run_id=run.id, reason="retry"))
    return view(run)
