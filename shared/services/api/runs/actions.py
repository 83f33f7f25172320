"""What a user does to a run after the draft: launch, cancel, recover (verify an adapter, start the
machine, resume training), retry a release, stop a machine started for recovery."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from shared.clock import now
from shared.context import Context
from shared.errors import Conflict, InvalidInput, ProviderError
from shared.key_rotation import current_key_since
from shared.lifecycle import ACTIVE, TERMINAL, transition
from shared.log import redact_text
from shared.models import (
    Deadlines,
    GpuOffer,
    Outcome,
    Role,
    RunCancel,
    RunCandidate,
    RunLaunch,
    RunRecord,
    RunRecover,
    RunState,
    RunView,
    StepMessage,
)
from shared.org_storage.base import adapter_key
from shared.providers.registry import resumable_providers, resumes_training
from shared.runs import billing, budgets
from shared.runs.admission import find_offer
from shared.runs.candidates import candidates_of
from shared.runs.events import event
from shared.runs.machine import stop_machine
from shared.runs.moves import decide_stored, move_stored
from shared.runs.org_backends import compute_for, ref_of, run_connection, storage_for
from shared.runs.retention import checkpoint_saved
from shared.security import Principal, require
from shared.services.api import quotas
from shared.services.api.runs.adapter import MAX_UPLOAD
from shared.services.api.runs.checkpoints import named, read_checkpoint
from shared.services.api.runs.view import view
from shared.services.steps.launch import EXPORT_MARGIN_S
from shared.steps import Step, serving

# A cancel of a run in these states must say discard true or false: its machine may hold the
# only copy of the adapter.
# How long a training run cancelled with its disk kept runs on before its machine is stopped: a heartbeat of its
# agent (every second on the local provider, 30 s on a cloud, whose machine stop reaches the agent as a SIGTERM
# anyway) and its trainer's checkpoint of the current step.
CANCEL_CHECKPOINT_S = 20
MAY_HOLD_OUTPUT = frozenset({RunState.training, RunState.exporting, RunState.verifying, RunState.retaining,
                             RunState.retained, RunState.recovering})


def launch(ctx: Context, principal: Principal, run_id: str, body: RunLaunch) -> RunView:
    require(principal, Role.owner, Role.member)
    if not body.confirm:
        raise InvalidInput.field("confirm", "launching rents a GPU billed to your account; send confirm: true")
    store = ctx.store
    run, _ = store.runs.get(principal.org, run_id)
    if run.state != RunState.draft:
        raise Conflict(f"nothing was launched: the run is {run.state.value}"
                       + (" (launched already)" if run.launched_at else "") + "; only a draft can be launched")
    limits = quotas.check_launch(ctx, principal, run)  # org limits (they may have changed since the draft)
    # One of max_active_runs slots, taken atomically before the run is written queued (so
    # simultaneous launches cannot all take the last one);
    # every refusal or error after this frees it again.
    added = quotas.reserve_active(ctx, principal, run, limits)
    try:
        run = _launch_reserved(ctx, principal, run_id, run, limits)
    except BaseException:
        if added:
            quotas.free_unless_launched(ctx, principal.org, run_id)
        raise
    # Sent after the write: a crash in between leaves a queued run that heartbeat-check re-sends.
    ctx.queues.send(Step.launch, StepMessage(org=run.org, run_id=run.id))
    return view(ctx, run)


def _launch_reserved(ctx: Context, principal: Principal, run_id: str, run: RunRecord, limits: quotas.OrgLimits) -> RunRecord:
    """The rest of a launch, once the run holds an active-run slot: the rate limit, the offer's
    price now, the connection, then the draft -> queued write. Returns the run as queued."""
    quotas.take_launch(ctx, principal, limits)
    # Every candidate at its price now: the launch may end on any of them, so none may be above the limit.
    fresh: list[RunCandidate] = []
    for i, cand in enumerate(candidates_of(run)):
        which = f"candidate {i + 1} ({cand.connection} {cand.offer.offer_id}): " if run.candidates else ""
        try:
            offer = find_offer(ctx, principal.org, cand.connection, cand.offer.offer_id)
        except InvalidInput as exc:
            if not run.candidates:
                raise
            raise Conflict(f"nothing was launched: {which}{exc.detail}") from exc
        if offer.total_per_hour > run.price_limit_per_hour:
            changed = abs(offer.total_per_hour - cand.offer.total_per_hour) > 1e-9
            price = (f"the offer now costs {offer.total_per_hour:.4f}/h (it was {cand.offer.total_per_hour:.4f}/h "
                     "when the draft was saved)" if changed else f"the estimate is {offer.total_per_hour:.4f}/h")
            raise Conflict(f"nothing was launched: {which}{price}, above the run's limit of "
                           f"{run.price_limit_per_hour:.4f}/h; raise price_limit_per_hour (PATCH the draft) or choose "
                           "another offer")
        compute_for(ctx, principal.org, cand.connection, require_connected=True)
        fresh.append(cand.model_copy(update={"offer": offer}))
    offer = fresh[0].offer
    # The budgets, at the dearest candidate's price found now: atomic like the active-run slot
    # (shared/runs/budgets.py).
    priced = run.model_copy(update={"offer": offer, "candidates": fresh if run.candidates else []})
    budgeted = budgets.reserve(ctx, principal.org, priced, budgets.hourly_price(priced) * run.runtime_limit_s / 3600,
                               limits)
    try:
        return _write_queued(ctx, principal, run_id, offer, fresh)
    except BaseException:
        if budgeted:
            budgets.release(ctx, principal.org, run_id)
        raise


def _write_queued(ctx: Context, principal: Principal, run_id: str, offer: GpuOffer, fresh: list[RunCandidate]) -> RunRecord:
    # The current signing key's first sighting is recorded no later than launched_at: a bootstrap claim on a
    # rotated-out key is accepted only for a run launched before it (shared/services/api/boot.py), and a launch
    # step that recorded it later than this launch (the clock moved in between) would let a forged claim pass.
    current_key_since(ctx)
    t = now()

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.draft:
            return None
        r = transition(r, RunState.queued, reason="")
        settings = ctx.settings
        return r.model_copy(update={
            "offer": offer,  # the price at launch is what the run records
            "candidates": fresh if r.candidates else [], "candidate_index": 0,
            "launched_at": t,
            "deadlines": Deadlines(provisioning_by=t + timedelta(seconds=settings.provisioning_timeout_s),
                                   runtime_by=t + timedelta(seconds=r.runtime_limit_s)),
        })

    run, wrote = move_stored(ctx, principal.org, run_id, change)
    if not wrote:  # a concurrent launch (or cancel) got there first
        raise Conflict(f"nothing was launched: the run is {run.state.value}; only a draft can be launched")
    return run


def cancel(ctx: Context, principal: Principal, run_id: str, body: RunCancel) -> RunView:
    require(principal, Role.owner, Role.member)

    def plan(state: RunState) -> tuple[RunState, Outcome | None]:
        if state == RunState.draft:
            return RunState.cancelled, None
        discard = body.discard
        if discard is None:
            if state in MAY_HOLD_OUTPUT:
                # A bare cancel must never delete the only copy of an adapter.
                raise InvalidInput.field("discard", (
                    f"the run is {state.value} and its machine may hold the only copy of its output; send "
                    "discard: true (release the machine and disk, deleting any output on them) or discard: false "
                    "(stop the machine and keep its disk for recovery)"))
            discard = True  # not trained yet: nothing on the machine to keep
        if discard or state == RunState.queued:
            # A queued run has no machine yet (launch writes provisioning before any cloud
            # call), so there is no disk to keep: it is released (nothing) and cancelled.
            return RunState.releasing, Outcome.cancelled
        if state in ACTIVE or state == RunState.verifying:
            return RunState.retaining, None
        raise Conflict(f"the run is {state.value}; cancel with discard: true to release its machine and disk")

    def change(r: RunRecord) -> tuple[RunRecord | None, RunState]:
        # Decided from the run as stored now: a step may have moved it since the user saw it
        # (queued -> provisioning), and the cancel must still apply to where it is.
        if r.state in TERMINAL or r.state == RunState.releasing:
            return None, r.state
        target, outcome = plan(r.state)
        reason = f"cancelled by {principal.sub}"
        if target == RunState.retaining and r.state == RunState.training:
            reason += ("; the trainer is asked to save a checkpoint of its current step before the machine is "
                       "stopped and its disk kept")
        return transition(r, target, reason=reason, outcome=outcome), r.state

    new, wrote, was = decide_stored(ctx, principal.org, run_id, change)
    step = serving(new.state)
    if wrote and step is not None:
        # Sent after the write: a crash in between leaves retaining to heartbeat-check's
        # re-send and releasing to the sweeper. A training run kept for recovery is stopped a little later:
        # its agent hears `stop` in a heartbeat reply meanwhile and has its trainer save a checkpoint of the
        # step it is on (a SIGTERM: machine/trainer/lora.py), uploaded at once, so a cancel before the first
        # periodic checkpoint still leaves one to resume from.
        delay = CANCEL_CHECKPOINT_S if new.state == RunState.retaining and was == RunState.training else 0
        ctx.queues.send(step, StepMessage(org=new.org, run_id=new.id), delay_s=delay)
    return view(ctx, new)


def _why_retained(run: RunRecord) -> str:
    """Why a retained run was retained: its reason, or after a refused recovery ("<why>. Recovery
    refused: ...") the why kept through it (a later retention, after a resume, has its own reason)."""
    first = run.retained_reason.rstrip(". ")
    return run.retained_reason if first and run.reason.startswith(f"{first}. Recovery refused:") else run.reason


def recover(ctx: Context, principal: Principal, run_id: str, upload: bytes | None, body: RunRecover | None,
            accept_checkpoint: str | None = None) -> RunView:
    """Recover a retained run: verify an uploaded adapter, verify the saved one, start the machine, or
    resume training from the last checkpoint. A checkpoint's adapter ends the run only when the caller
    accepts it (body accept_checkpoint, or the query parameter `accept_checkpoint` with an upload)."""
    require(principal, Role.owner, Role.member)
    if upload is not None:
        # An upload is a heavy request whatever happens to it: counted with the dataset uploads, first.
        quotas.take(ctx, principal, "upload")
    accept = body.accept_checkpoint if body else _flag("accept_checkpoint", accept_checkpoint)
    store = ctx.store
    run, _ = store.runs.get(principal.org, run_id)
    if run.state == RunState.recovering:
        return view(ctx, run)
    quotas.take(ctx, principal, "recover")  # a recovery verifies an archive or starts a machine
    if run.state != RunState.retained:
        raise Conflict(f"only a retained run can be recovered; this one is {run.state.value}")
    mode = "upload" if upload is not None else (body.mode if body else "verify_saved")
    if mode == "verify_saved" and _nothing_saved(ctx, run):
        # Refused before anything moves: a recovery that can only fail would say so minutes later.
        raise Conflict("there is nothing in storage to verify: no checkpoint or adapter of this run was saved (it "
                       "stopped before its first checkpoint); recover with mode start_machine to look at its disk, "
                       "or cancel with discard: true to release the machine and disk")
    named_step = body.checkpoint if body else None
    if named_step is not None and mode == "start_machine":
        raise InvalidInput.field("checkpoint", "applies to mode verify_saved or resume, not start_machine")
    if named_step is not None and mode == "resume":
        newest = max((c.step for c in run.checkpoints), default=None)
        if named_step != newest:
            raise Conflict(f"only the newest kept checkpoint ({newest}) is on the machine's disk to resume from; "
                           f"recover checkpoint {named_step} with mode verify_saved (its adapter ends the run)")
    if mode == "resume":
        return _resume(ctx, run)
    if mode == "start_machine":
        run = _request_restart(ctx, run)
        try:
            outcome = compute_for(ctx, run.org, run_connection(run)).start(ref_of(ctx, run), run.resources)
        except ProviderError as exc:
            raise Conflict(f"the cloud refused to start the machine: {redact_text(exc.reason)}; the run stays "
                           "retained: try mode start_machine again later, or recover with mode verify_saved or "
                           "an adapter.zip upload") from exc
        rearm_backstop(ctx, run, ctx.settings.recovery_idle_stop_s)
        note = outcome.billing_note or "the machine is starting: GPU billing resumes, training does not"
        note += (f"; it is stopped automatically after {ctx.settings.recovery_idle_stop_s} s, or stop it with "
                 f"POST /api/runs/{run.id}/stop (`tensorant runs stop {run.id}`)")
        event(ctx, run, "audit", f"machine start requested for recovery: {note}", detail=outcome.detail, machine="started")
        started = now()

        def note_billing(r: RunRecord) -> RunRecord | None:
            if r.state != RunState.retained:
                return None
            r = billing.switched(r, True, started)  # GPU billing resumes
            return r.model_copy(update={"billing_note": note, "machine_started_at": started, "updated_at": started})

        return view(ctx, store.runs.mutate(run.org, run.id, note_billing)[0])
    sha = ""
    if upload is not None:
        if not upload:
            raise InvalidInput.field("body", "the upload is empty; send the adapter.zip bytes")
        if len(upload) > MAX_UPLOAD:
            raise InvalidInput.field("body", "the upload is over 1 GiB; that is not a LoRA adapter archive")
        storage_for(ctx, run.org).put(adapter_key(run.id), upload)
        sha = hashlib.sha256(upload).hexdigest()
    size = len(upload) if upload else 0
    if named_step is not None:
        # The named checkpoint's archive (checked against the agent's report) becomes the run's adapter archive,
        # recorded with its sha256 below so the verifier reads exactly it; a crash before that write leaves
        # the run retained, to recover again.
        kept = named(run, named_step)
        storage_for(ctx, run.org).put(adapter_key(run.id), read_checkpoint(ctx, run, kept))
        sha, size, accept = kept.sha256, kept.size, True

    source = (f"checkpoint {named_step}'s adapter" if named_step is not None
              else "uploaded adapter" if sha else "saved adapter")

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.retained:
            return None
        # Why it was retained outlives this recovery's reason: a refused recovery says both.
        kept = _why_retained(r)
        r = transition(r, RunState.recovering, reason=f"recovery: {source}"
                       + (", a checkpoint's accepted" if accept else ""))
        # The owner's choice holds for this recovery only (verify-adapter reads it).
        r = r.model_copy(update={"accept_checkpoint": accept, "retained_reason": kept})
        return r.model_copy(update={"adapter_sha256": sha, "adapter_size": size}) if sha else r

    new, _ = move_stored(ctx, run.org, run.id, change)
    ctx.queues.send(Step.verify_adapter, StepMessage(org=new.org, run_id=new.id, reason="recovery"))
    return view(ctx, new)


def _nothing_saved(ctx: Context, run: RunRecord) -> bool:
    """Whether storage says no adapter of the run is there; a storage that does not answer is not a no (the
    recovery's verification then says what it finds). Checkpoints the agent reported kept in their slots are
    something saved, whether or not one reached the adapter's own key."""
    if run.checkpoints:
        return False
    try:
        return not checkpoint_saved(ctx, run)
    except Exception:
        return False


def _resume(ctx: Context, run: RunRecord) -> RunView:
    """Start the retained machine and move the run back to training (`recover --resume`). The agent, stopped
    while its trainer had a checkpoint, hears `resume: true` in a heartbeat reply and runs the trainer again
    from that checkpoint (machine/agent/agent.py): on a cloud its machine boots again and the container
    starts again on the kept disk; on the local provider a trainer frozen by the retain simply continues.
    The runtime limit and the heartbeat deadline count again from now: the old ones have passed, or the
    run would not be retained. A resume that fails later (the trainer cannot load the checkpoint, the agent
    never reports) retains the run again, disk kept: only a discard deletes."""
    # Nothing saved first: the other refusal would send the owner to verify_saved, which then fails too.
    if not checkpoint_saved(ctx, run):
        raise Conflict("there is nothing to resume from: no checkpoint of this run was saved (its adapter is not in "
                       "storage), so training would start over; cancel with discard, or launch a new run")
    if not resumes_training(run.provider):
        able = ", ".join(resumable_providers()) or "no provider"
        raise Conflict(f"resume is not available on {run.provider} (it is on {able}); recover with mode "
                       "verify_saved (the last checkpoint's adapter is in storage) instead")
    store, started = ctx.store, now()

    def starting(r: RunRecord) -> RunRecord | None:
        # Written before the cloud call: a crash after the start leaves a run that shows its machine started
        # and bills it (heartbeat-check's idle stop stops it again), never a running machine billed as disk.
        if r.state != RunState.retained:
            return None
        r = billing.switched(r, True, started)
        return r.model_copy(update={"machine_started_at": r.machine_started_at or started, "updated_at": started,
                                    "restart_requested_at": started,
                                    "billing_note": "the machine is being started to resume training"})

    run, wrote = store.runs.mutate(run.org, run.id, starting)
    if run.state != RunState.retained:
        return view(ctx, run)
    if wrote:
        event(ctx, run, "audit", "machine start requested to resume training from the last checkpoint", machine="started")
    try:
        outcome = compute_for(ctx, run.org, run_connection(run)).start(ref_of(ctx, run), run.resources)
    except ProviderError as exc:
        why = redact_text(exc.reason)

        def not_started(r: RunRecord) -> RunRecord | None:
            if r.state != RunState.retained:
                return None
            r = billing.switched(r, False, now())
            return r.model_copy(update={"machine_started_at": None, "updated_at": now(),
                                        "billing_note": "the machine is stopped; its disk still bills"})

        run, _ = store.runs.mutate(run.org, run.id, not_started)
        event(ctx, run, "warning", f"the resume did not start the machine: {why}", machine="stopped")
        raise Conflict(f"the cloud refused to start the machine: {why}; the run stays retained with its disk: try "
                       "mode resume again later, or recover with mode verify_saved") from exc
    rearm_backstop(ctx, run, ctx.settings.provisioning_timeout_s + run.runtime_limit_s)
    t = now()

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.retained:
            return None
        r = transition(r, RunState.training, reason="resumed from the last checkpoint")
        deadlines = r.deadlines.model_copy(update={
            "runtime_by": t + timedelta(seconds=r.runtime_limit_s),
            "heartbeat_by": t + timedelta(seconds=ctx.settings.heartbeat_timeout_s)})
        return r.model_copy(update={"deadlines": deadlines, "machine_started_at": None,
                                    "billing_note": outcome.billing_note or r.billing_note})

    new, wrote = move_stored(ctx, run.org, run.id, change)
    if wrote:
        event(ctx, new, "audit", "machine started to resume training from the last checkpoint", detail=outcome.detail)
    return view(ctx, new)


def _request_restart(ctx: Context, run: RunRecord) -> RunRecord:
    """Recorded before the cloud call starts the retained machine: its agent comes back with a token that may
    have expired while the machine was stopped, and may exchange it once for a fresh one because of this start
    (shared/services/api/boot.py exchange_restart). A crash after this write leaves only an exchange open that
    nobody without the run's signed token can use."""
    t = now()

    def change(r: RunRecord) -> RunRecord | None:
        return r.model_copy(update={"restart_requested_at": t}) if r.state == RunState.retained else None

    return ctx.store.runs.mutate(run.org, run.id, change)[0]


def _flag(field: str, value: str | None) -> bool:
    """A query parameter's true or false (absent: false)."""
    if value is None or value.strip().lower() in ("", "false", "0"):
        return False
    if value.strip().lower() in ("true", "1"):
        return True
    raise InvalidInput.field(field, "true or false")


def retry_release(ctx: Context, principal: Principal, run_id: str) -> RunView:
    require(principal, Role.owner, Role.member)
    run, _ = ctx.store.runs.get(principal.org, run_id)
    if run.state != RunState.releasing:
        raise Conflict(f"only a run in releasing can retry its release; this one is {run.state.value}")
    quotas.take(ctx, principal, "release")
    event(ctx, run, "audit", f"release retry requested by {principal.sub}")
    ctx.queues.send(Step.release, StepMessage(org=run.org, run_id=run.id, reason="retry"))
    return view(ctx, run)


def stop(ctx: Context, principal: Principal, run_id: str) -> RunView:
    """Stop a retained run's machine again (provider.retain once more): a machine started for
    recovery bills for its GPU until then. Safe to repeat; the disk is kept."""
    require(principal, Role.owner, Role.member)
    run, _ = ctx.store.runs.get(principal.org, run_id)
    if run.state not in (RunState.retained, RunState.recovering):
        raise Conflict(f"only a retained run's machine can be stopped; this one is {run.state.value}"
                       + ("" if run.state in TERMINAL else " (its machine is the control plane's to stop)"))
    try:
        run = stop_machine(ctx, run, why=f"stopped by {principal.sub}")
    except ProviderError as exc:
        raise Conflict(f"the cloud refused to stop the machine: {redact_text(exc.reason)}; it may still be "
                       "billing: try again, or stop it in the cloud console") from exc
    return view(ctx, run)


def rearm_backstop(ctx: Context, run: RunRecord, for_s: float) -> None:
    """Move the cloud's own stop of a machine started again (Azure's auto-shutdown schedule, the provider's
    optional arm_backstop) to its new hard deadline: `for_s` from now plus the export margin. A provider without
    one (AWS stops itself on a guest poweroff, RunPod's pod stop is the machine's own) needs nothing."""
    arm = getattr(compute_for(ctx, run.org, run.provider), "arm_backstop", None)
    if callable(arm):
        event(ctx, run, "audit", str(arm(ref_of(ctx, run), now() + timedelta(seconds=for_s + EXPORT_MARGIN_S))))
