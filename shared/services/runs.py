"""User-facing run operations: draft, launch, get/list/logs, cancel, recover, retry release."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from shared.clock import now
from shared.errors import Conflict, InvalidInput
from shared.http import invalid
from shared.log import redact_text
from shared.models import (
    CloudResource,
    DatasetVersionRecord,
    Deadlines,
    Forecast,
    GpuOffer,
    Outcome,
    Role,
    RunCancel,
    RunCreate,
    RunKind,
    RunLaunch,
    RunPatch,
    RunRecord,
    RunRecover,
    RunState,
    RunView,
    StepMessage,
    TrainingSettings,
)
from shared.providers.errors import ProviderError
from shared.queues import get_queues
from shared.runs.lifecycle import ACTIVE, TERMINAL, transition
from shared.runs.steps import Step
from shared.security import Principal, require
from shared.services import base_models, forecast, quotas, usage
from shared.services.backends import compute_for, compute_slot, ref_of, storage_for
from shared.services.catalog import cached_offers, find_offer
from shared.services.projects import new_id
from shared.services.run_events import event, transition_event
from shared.settings import get_settings
from shared.storage.base import ObjectMissing, adapter_key
from shared.store import get_store

MAX_UPLOAD = 1024 * 1024 * 1024
# A cancel of a run in these states must say discard true or false (issue 12.2).
MAY_HOLD_OUTPUT = frozenset({RunState.training, RunState.exporting, RunState.verifying, RunState.retaining,
                             RunState.retained, RunState.recovering})


# A run view reads one bounded page of events (its timeline), never the whole partition.
VIEW_EVENTS = 200


# Resource kinds that are the machine itself (stopped on retain); the others are its disk,
# volume, NIC or work directory (kept on retain).
MACHINE_KINDS = {"instance", "vm", "pod", "process"}


def resource_states(run: RunRecord, t: usage.Timing) -> list[CloudResource]:
    """Each recorded resource with its current state, from where the run is now.

    The state recorded at launch ("running") goes stale: the run's state says what the
    steps have done to the machine since (stopped and kept, being released, released).
    """
    out = []
    for res in run.resources:
        if run.state in TERMINAL or t.released_at is not None:
            state = "released"
        elif run.state == RunState.releasing:
            state = "releasing"
        elif run.state == RunState.retaining:
            state = "stopping" if res.kind in MACHINE_KINDS else "kept"
        elif run.state in (RunState.retained, RunState.recovering):
            if res.kind in MACHINE_KINDS:
                state = "running (started for recovery)" if t.machine_running else "stopped"
            else:
                state = "kept"
        elif res.kind in MACHINE_KINDS:
            state = res.state or "running"
        else:
            state = "in use"
        out.append(res.model_copy(update={"state": state}))
    return out


def warnings_of(run: RunRecord) -> list[str]:
    if run.state != RunState.draft:
        return []
    out = []
    if run.offer.total_per_hour > run.price_limit_per_hour:
        out.append(f"the estimate {run.offer.total_per_hour:.4f} {run.offer.currency}/h is above the price limit "
                   f"{run.price_limit_per_hour:.4f}/h: launch will be refused until price_limit_per_hour is raised "
                   "or another offer is chosen")
    if run.forecast is not None:  # issue 19.6: limits that will not cover the forecast
        out += forecast.warnings(run.forecast, run.price_limit_per_hour, run.runtime_limit_s, run.offer.currency)
    return out


def view(run: RunRecord, with_events: bool = True) -> RunView:
    events = get_store().list_events(run.id, exclude_kind="log", limit=VIEW_EVENTS) if with_events else []
    t = usage.timing(run, [] if run.state == RunState.draft else (events if with_events else None))
    return RunView(
        id=run.id, org=run.org, project_id=run.project_id, kind=run.kind, provider=run.provider, state=run.state,
        outcome=run.outcome, phase=run.phase if run.state in ACTIVE else "", progress=run.progress,
        reason=run.reason, billing_note=run.billing_note,
        offer=run.offer, estimate_per_hour=run.offer.total_per_hour, price_limit_per_hour=run.price_limit_per_hour,
        runtime_limit_s=run.runtime_limit_s, base_model=run.base_model, dataset_version_id=run.dataset_version_id,
        resources=resource_states(run, t), adapter_sha256=run.adapter_sha256, release_error=run.release_error,
        release_attempts=run.release_attempts, created_at=run.created_at, updated_at=run.updated_at, events=events,
        training=run.training,
        started_at=t.started_at, machine_up_at=t.machine_up_at, released_at=t.released_at, elapsed_s=t.elapsed_s,
        billed_machine_s=t.machine_s, billed_disk_only_s=t.disk_only_s, cost_so_far=t.cost,
        final_cost=t.final_cost, warnings=warnings_of(run), forecast=run.forecast,
        forecast_check=run.forecast_check,
    )


# Trial runs (issue 10): a small sample, a few steps, a short default time limit, so a user sees
# the whole flow and a first adapter in minutes. A user's smaller values win.
TRIAL_MAX_EXAMPLES = 64
TRIAL_MAX_STEPS = 30
TRIAL_RUNTIME_LIMIT_S = 20 * 60


def resolve_training(kind: RunKind, training: TrainingSettings) -> TrainingSettings:
    """The settings the trainer gets: `kind` from the run, trial bounds applied."""
    if training.kind is not None and training.kind != kind.value:
        raise InvalidInput.field("training.kind", f"is {training.kind!r} but the run's kind is {kind.value!r}; "
                                 "leave it out (it is set from the run's kind)")
    update: dict[str, Any] = {"kind": kind.value}
    if kind == RunKind.trial:
        update["max_examples"] = min(training.max_examples or TRIAL_MAX_EXAMPLES, TRIAL_MAX_EXAMPLES)
        update["max_steps"] = min(training.max_steps or TRIAL_MAX_STEPS, TRIAL_MAX_STEPS)
    return training.model_copy(update=update)


def _check_fit(org: str, provider: str, offer: GpuOffer, base_model: str, training: TrainingSettings) -> None:
    """422 on offer_id when the offer cannot hold the model at these settings, with the offers that can."""
    model = base_models.declared(base_model)
    got = base_models.fit(model, offer, training)
    if got.fits:
        return
    eligible = [o.offer_id for o in cached_offers(org, provider) if base_models.fit(model, o, training).fits]
    choose = (f"offers that fit: {', '.join(eligible[:20])}" if eligible
              else f"no {provider} offer fits; lower batch_size or max_seq_len, or set load_in_4bit")
    raise InvalidInput(f"offer_id: {got.why}; {choose}", errors=[{
        "field": "offer_id", "message": got.why, "memory_needed_gb": got.memory_needed_gb,
        "eligible_offer_ids": eligible}])


def _check_provider(org: str, provider: str) -> None:
    from shared.providers import registry

    if provider not in registry.compute_names():
        raise InvalidInput.field("provider", f"unknown provider {provider!r}; use one of "
                                 f"{', '.join(registry.compute_names())}")
    if get_store().get_connection(org, compute_slot(provider)) is None:
        raise InvalidInput.field("provider", f"no {provider} compute connection is saved; an owner saves it first "
                                 f"(`tensorant connections save-compute {provider} ...`)")


@dataclass(frozen=True)
class CheckedRequest:
    """A run request that passed every check a draft must pass, resolved as the run stores it."""

    offer: GpuOffer
    training: TrainingSettings
    runtime_limit_s: int
    dataset: DatasetVersionRecord
    forecast: Forecast
    # Said in the run's events when the default runtime limit came from the forecast; else "".
    limit_note: str = ""


def check_request(org: str, body: RunCreate) -> CheckedRequest:
    """Every check a draft passes, the one path for create and a draft's edit (issue 18.2: an edit
    that skipped them saved an undeclared model, which the machine then fetched from the hub with
    the org's token). The org's limits and the rate limit are the caller's (quotas)."""
    store = get_store()
    model = base_models.declared(body.base_model)  # 422 before any lookup: the cheapest refusal first
    training = resolve_training(body.kind, body.training)
    store.get_project(org, body.project_id)
    dataset = store.get_dataset(org, body.dataset_version_id)
    if dataset.project_id != body.project_id:
        raise InvalidInput.field("dataset_version_id", "this dataset version belongs to another project")
    _check_provider(org, body.provider)
    base_models.refuse_test_model_off_local(model, body.provider)
    offer = find_offer(org, body.provider, body.offer_id)
    _check_fit(org, body.provider, offer, body.base_model, training)
    like = forecast.like_runs_measured(store.list_runs(org, {RunState.succeeded}), body.provider, body.base_model,
                                       offer.gpu, training)
    predicted = forecast.make(dataset, training, model, offer, like)
    limit, note = _runtime_limit(org, body, predicted)
    return CheckedRequest(offer=offer, training=training, runtime_limit_s=limit, dataset=dataset,
                          forecast=predicted, limit_note=note)


def _runtime_limit(org: str, body: RunCreate, predicted: Forecast) -> tuple[int, str]:
    """The user's runtime limit; else the default (a trial's 20 min, a full run's setting), unless the
    forecast with its margin needs more: then that, capped by the org's max_runtime_limit_s (a limit
    the org refuses would make the draft unlaunchable). Returns the limit and what to say about it."""
    if body.runtime_limit_s:
        return body.runtime_limit_s, ""
    default = TRIAL_RUNTIME_LIMIT_S if body.kind == RunKind.trial else get_settings().default_runtime_limit_s
    wanted = forecast.runtime_limit_for(predicted)
    if wanted <= default:
        return default, ""
    cap = quotas.get_limits(org).max_runtime_limit_s
    limit = min(wanted, cap)
    capped = f", capped at the organization's max_runtime_limit_s of {cap // 60} min" if limit < wanted else ""
    return limit, (f"runtime limit set to {limit // 60} min from the forecast ({forecast.RUNTIME_MARGIN:g} x "
                   f"~{forecast.minutes(predicted.total_s)}, rounded up to {forecast.RUNTIME_STEP_S // 60} min"
                   f"{capped}): the default of {default // 60} min is shorter than the forecast needs")


def _draft_fields(body: RunCreate, checked: CheckedRequest) -> dict[str, Any]:
    """What a draft stores of a checked request (create and edit alike)."""
    return {
        "kind": body.kind, "provider": body.provider, "offer": checked.offer,
        "price_limit_per_hour": body.price_limit_per_hour, "runtime_limit_s": checked.runtime_limit_s,
        "dataset_version_id": body.dataset_version_id, "base_model": body.base_model, "training": checked.training,
        "forecast": checked.forecast,
        # training.kind is the run's kind (checked above): kept out, so a later kind switch applies.
        "request": body.model_copy(update={"training": body.training.model_copy(update={"kind": None})}),
    }


def _forecast_events(run: RunRecord, checked: CheckedRequest) -> None:
    """The forecast in the run's history, and why the runtime limit is not the default when it is not."""
    if run.forecast is not None:
        event(run, "audit", f"forecast: {forecast.summary(run.forecast, run.offer.currency)}; {run.forecast.basis}",
              **run.forecast.model_dump(exclude={"basis"}))
    if checked.limit_note:
        event(run, "audit", checked.limit_note, runtime_limit_s=run.runtime_limit_s)


def _kind_event(run: RunRecord, dataset: DatasetVersionRecord) -> None:
    if run.kind == RunKind.trial:
        event(run, "audit", f"trial run: trains on at most {run.training.max_examples} of the dataset's "
                            f"{dataset.rows} examples and {run.training.max_steps} steps, runtime limit "
                            f"{run.runtime_limit_s // 60} min; a full run uses the whole dataset",
              max_examples=run.training.max_examples, max_steps=run.training.max_steps)
    else:
        event(run, "audit", f"full run: trains on all {dataset.rows} examples, runtime limit "
                            f"{run.runtime_limit_s // 60} min")


def create(principal: Principal, body: RunCreate) -> RunView:
    require(principal, Role.owner, Role.member)
    quotas.check_create(principal, body)  # 11.8: org limits and the run rate limit
    checked = check_request(principal.org, body)
    t = now()
    run = RunRecord(
        org=principal.org, id=new_id("r"), project_id=body.project_id, created_at=t, updated_at=t,
        state_changed_at=t, created_by=principal.sub, **_draft_fields(body, checked),
    )
    get_store().create_run(run)
    event(run, "transition", "draft saved; nothing is rented until launch",
          estimate_per_hour=checked.offer.total_per_hour)
    _kind_event(run, checked.dataset)
    _forecast_events(run, checked)
    for warning in warnings_of(run):
        event(run, "warning", warning)
    return view(run)


def request_of(run: RunRecord) -> RunCreate:
    """The draft's request as the user sent it. Records from before it was stored: rebuilt from
    the draft, the values that a trial's defaults and bounds put there taken out again."""
    if run.request is not None:
        return run.request
    training = run.training.model_copy(update={"kind": None})
    runtime: int | None = run.runtime_limit_s
    if run.kind == RunKind.trial:
        training = training.model_copy(update={
            "max_examples": None if training.max_examples == TRIAL_MAX_EXAMPLES else training.max_examples,
            "max_steps": None if training.max_steps == TRIAL_MAX_STEPS else training.max_steps})
        runtime = None if runtime == TRIAL_RUNTIME_LIMIT_S else runtime
    return RunCreate(project_id=run.project_id, kind=run.kind, provider=run.provider, offer_id=run.offer.offer_id,
                     price_limit_per_hour=run.price_limit_per_hour, runtime_limit_s=runtime,
                     dataset_version_id=run.dataset_version_id, base_model=run.base_model, training=training)


def patch(principal: Principal, run_id: str, body: RunPatch) -> RunView:
    """Edit a draft: the fields given replace the draft's request (training: the settings given),
    and the result is checked whole, exactly as a create of it would be (issue 18.2); a refused
    edit changes nothing."""
    require(principal, Role.owner, Role.member)
    store = get_store()
    run, _ = store.get_run(principal.org, run_id)
    if run.state != RunState.draft:
        raise Conflict(f"only a draft can be edited; this run is {run.state.value}")
    fields = body.model_dump(exclude_none=True, exclude={"training"})
    if body.training is not None:
        fields["training"] = body.training.model_dump(exclude_unset=True)
    if not fields:
        raise InvalidInput.field("body", "send at least one field to change (the fields of a run create)")
    request = request_of(run)
    merged = request.model_dump() | fields
    merged["training"] = request.training.model_dump() | fields.get("training", {})
    try:
        edited = RunCreate.model_validate(merged)
    except ValidationError as exc:
        raise invalid(exc) from exc
    quotas.check_edit(principal, edited)  # 11.8: the org's limits, as at create
    checked = check_request(principal.org, edited)
    updates = _draft_fields(edited, checked) | {"updated_at": now()}

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.draft:
            return None
        if r != run:
            # Checked as read: an edit in between (say, another model) was not checked with this one.
            raise Conflict("the draft was changed by another request while this edit was checked; nothing was "
                           "changed by this one: read the draft and send the edit again")
        return r.model_copy(update=updates)

    new, wrote = store.mutate_run(principal.org, run_id, change)
    if not wrote:
        raise Conflict(f"only a draft can be edited; this run is {new.state.value} now")
    event(new, "audit", f"draft edited by {principal.sub}: {', '.join(sorted(fields))}")
    if new.kind != run.kind or new.training != run.training or new.runtime_limit_s != run.runtime_limit_s:
        _kind_event(new, checked.dataset)
    if new.forecast != run.forecast or new.runtime_limit_s != run.runtime_limit_s:
        _forecast_events(new, checked)
    for warning in warnings_of(new):
        event(new, "warning", warning)
    return view(new)


def delete(principal: Principal, run_id: str) -> None:
    """Delete a draft (nothing was rented for it); any other run is kept as a record."""
    require(principal, Role.owner, Role.member)
    store = get_store()
    run, etag = store.get_run(principal.org, run_id)
    if run.state != RunState.draft:
        raise Conflict(f"only a draft can be deleted; this run is {run.state.value} "
                       "(cancel it instead; ended runs stay as a record of what was billed)")
    store.delete_run(run.org, run.id, etag)  # ETag-guarded: a launch in between wins
    return None


def get(principal: Principal, run_id: str) -> RunView:
    run, _ = get_store().get_run(principal.org, run_id)
    return view(run)


def list_runs(principal: Principal) -> dict[str, Any]:
    runs = sorted(get_store().list_runs(principal.org), key=lambda r: r.created_at, reverse=True)
    return {"items": [view(r, with_events=False) for r in runs]}


LOG_PAGE_DEFAULT = 1000
LOG_PAGE_MAX = 5000


def logs(principal: Principal, run_id: str, after: str | None = None, limit: str | None = None) -> dict[str, Any]:
    """One page of the run's log lines after the cursor (a line number; none = from the start).

    `next` is the cursor for the following lines; null once the run is terminal and every
    stored line was returned (while it runs, polling with `next` picks up new lines)."""
    run, _ = get_store().get_run(principal.org, run_id)
    if after is None or after == "":
        start = 0
    elif after.isascii() and after.isdigit() and len(after) <= 10:
        start = int(after)
    else:
        raise InvalidInput.field("after", "a cursor from a previous page's `next`")
    if limit is None or limit == "":
        count = LOG_PAGE_DEFAULT
    elif limit.isascii() and limit.isdigit() and len(limit) <= 4 and 1 <= int(limit) <= LOG_PAGE_MAX:
        count = int(limit)
    else:
        raise InvalidInput.field("limit", f"a whole number from 1 to {LOG_PAGE_MAX}")
    lines, cursor = get_store().read_logs(run.id, start, count)
    done = len(lines) < count and run.state in TERMINAL
    return {"lines": lines, "next": None if done else str(cursor), "state": run.state.value}


# /metrics reads at most this many points (the newest kept), so a long run stays cheap to plot.
MAX_METRIC_POINTS = 2000
MAX_LOG_LINES_READ = 20000  # the per-run line cap of the log store


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def parse_metric_line(line: str) -> dict[str, Any] | None:
    """A trainer line `progress=.. step=<n> loss=<x> [lr=<y>]` as a point, else None."""
    text = line.strip()
    if not text.startswith("progress="):
        return None
    pairs = dict(p.split("=", 1) for p in text.split() if "=" in p)
    try:
        step = int(pairs.get("step", ""))
    except ValueError:
        return None
    loss = _number(pairs.get("loss", ""))
    if loss is None:
        return None
    lr = _number(pairs["lr"]) if "lr" in pairs else None
    return {"step": step, "loss": loss, "lr": lr}


def _eval_loss(line: str) -> float | None:
    # lora.py prints "trainer: eval_loss after training = 1.2345"; accept eval_loss=<x> too.
    text = line.strip()
    if "eval_loss after training" in text:
        return _number(text.rsplit("=", 1)[-1].strip())
    for part in text.split():
        if part.startswith("eval_loss="):
            return _number(part.removeprefix("eval_loss="))
    return None


def metrics(principal: Principal, run_id: str) -> dict[str, Any]:
    """Per-step loss from the trainer's progress lines in the run's stored logs."""
    get_store().get_run(principal.org, run_id)
    points: dict[int, dict[str, Any]] = {}
    eval_loss: float | None = None
    lines, _ = get_store().read_logs(run_id, 0, MAX_LOG_LINES_READ)
    for line in lines:
        point = parse_metric_line(line)
        if point is not None:
            points[point["step"]] = point  # a step repeated (a restarted agent) keeps its last value
        elif "eval_loss" in line and (value := _eval_loss(line)) is not None:
            eval_loss = value
    ordered = [points[k] for k in sorted(points)]
    return {"points": ordered[-MAX_METRIC_POINTS:], "eval_loss": eval_loss,
            "truncated": len(ordered) > MAX_METRIC_POINTS}


def launch(principal: Principal, run_id: str, body: RunLaunch) -> RunView:
    require(principal, Role.owner, Role.member)
    if not body.confirm:
        raise InvalidInput.field("confirm", "launching rents a GPU billed to your account; send confirm: true")
    store = get_store()
    run, _ = store.get_run(principal.org, run_id)
    if run.state != RunState.draft:
        raise Conflict(f"nothing was launched: the run is {run.state.value}"
                       + (" (launched already)" if run.launched_at else "") + "; only a draft can be launched")
    limits = quotas.check_launch(principal, run)  # 11.8: org limits (they may have changed since the draft)
    # One of max_active_runs slots, taken atomically before the run is written queued (18.3);
    # every refusal or error after this frees it again.
    added = quotas.reserve_active(principal, run, limits)
    try:
        run = _launch_reserved(principal, run_id, run, limits)
    except BaseException:
        if added:
            quotas.free_unless_launched(principal.org, run_id)
        raise
    transition_event(RunState.draft, run)
    # Sent after the write: a crash in between leaves a queued run that heartbeat-check re-sends.
    get_queues().send(Step.launch, StepMessage(org=run.org, run_id=run.id))
    return view(run)


def _launch_reserved(principal: Principal, run_id: str, run: RunRecord, limits: quotas.OrgLimits) -> RunRecord:
    """The rest of a launch, once the run holds an active-run slot: the rate limit, the offer's
    price now, the connection, then the draft -> queued write. Returns the run as queued."""
    store = get_store()
    quotas.take_launch(principal, limits)
    offer = find_offer(principal.org, run.provider, run.offer.offer_id)
    if offer.total_per_hour > run.price_limit_per_hour:
        changed = abs(offer.total_per_hour - run.offer.total_per_hour) > 1e-9
        price = (f"the offer now costs {offer.total_per_hour:.4f}/h (it was {run.offer.total_per_hour:.4f}/h "
                 "when the draft was saved)" if changed else f"the estimate is {offer.total_per_hour:.4f}/h")
        raise Conflict(f"nothing was launched: {price}, above the run's limit of {run.price_limit_per_hour:.4f}/h; "
                       "raise price_limit_per_hour (PATCH the draft) or choose another offer")
    compute_for(principal.org, run.provider, require_connected=True)
    t = now()

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.draft:
            return None
        r = transition(r, RunState.queued, reason="")
        settings = get_settings()
        return r.model_copy(update={
            "offer": offer,  # the price at launch is what the run records
            "launched_at": t,
            "deadlines": Deadlines(provisioning_by=t + timedelta(seconds=settings.provisioning_timeout_s),
                                   runtime_by=t + timedelta(seconds=r.runtime_limit_s)),
        })

    run, wrote = store.mutate_run(principal.org, run_id, change)
    if not wrote:  # a concurrent launch (or cancel) got there first
        raise Conflict(f"nothing was launched: the run is {run.state.value}; only a draft can be launched")
    return run


def cancel(principal: Principal, run_id: str, body: RunCancel) -> RunView:
    require(principal, Role.owner, Role.member)
    store = get_store()

    def plan(state: RunState) -> tuple[RunState, Outcome | None, Step | None]:
        if state == RunState.draft:
            return RunState.cancelled, None, None
        discard = body.discard
        if discard is None:
            if state in MAY_HOLD_OUTPUT:
                # A bare cancel must never delete the only copy of an adapter (issue 12.2).
                raise InvalidInput.field("discard", (
                    f"the run is {state.value} and its machine may hold the only copy of its output; send "
                    "discard: true (release the machine and disk, deleting any output on them) or discard: false "
                    "(stop the machine and keep its disk for recovery)"))
            discard = True  # not trained yet: nothing on the machine to keep
        if discard or state == RunState.queued:
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
    """Recover a retained run: verify an uploaded adapter, verify the saved one, start the machine, or
    resume training from the last checkpoint."""
    require(principal, Role.owner, Role.member)
    store = get_store()
    run, _ = store.get_run(principal.org, run_id)
    if run.state == RunState.recovering:
        return view(run)
    quotas.take(principal, "recover")  # a recovery verifies an archive or starts a machine
    if run.state != RunState.retained:
        raise Conflict(f"only a retained run can be recovered; this one is {run.state.value}")
    mode = "upload" if upload is not None else (body.mode if body else "verify_saved")
    if mode == "resume":
        return _resume(run)
    if mode == "start_machine":
        try:
            outcome = compute_for(run.org, run.provider).start(ref_of(run), run.resources)
        except ProviderError as exc:
            raise Conflict(f"the cloud refused to start the machine: {redact_text(exc.reason)}; the run stays "
                           "retained: try mode start_machine again later, or recover with mode verify_saved or "
                           "an adapter.zip upload") from exc
        note = outcome.billing_note or "the machine is starting: GPU billing resumes, training does not"
        note += (f"; it is stopped automatically after {get_settings().recovery_idle_stop_s} s, or stop it with "
                 f"POST /api/runs/{run.id}/stop (`tensorant runs stop {run.id}`)")
        event(run, "audit", f"machine start requested for recovery: {note}", detail=outcome.detail)
        started = now()

        def note_billing(r: RunRecord) -> RunRecord | None:
            if r.state != RunState.retained:
                return None
            return r.model_copy(update={"billing_note": note, "machine_started_at": started, "updated_at": started})

        return view(store.mutate_run(run.org, run.id, note_billing)[0])
    sha = ""
    if upload is not None:
        if not upload:
            raise InvalidInput.field("body", "the upload is empty; send the adapter.zip bytes")
        if len(upload) > MAX_UPLOAD:
            raise InvalidInput.field("body", "the upload is over 1 GiB; that is not a LoRA adapter archive")
        storage_for(run.org).put(adapter_key(run.id), upload)
        sha = hashlib.sha256(upload).hexdigest()
    size = len(upload) if upload else 0

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.retained:
            return None
        r = transition(r, RunState.recovering, reason=f"recovery: {'uploaded adapter' if sha else 'saved adapter'}")
        return r.model_copy(update={"adapter_sha256": sha, "adapter_size": size}) if sha else r

    new, wrote = store.mutate_run(run.org, run.id, change)
    if wrote:
        transition_event(RunState.retained, new)
    get_queues().send(Step.verify_adapter, StepMessage(org=new.org, run_id=new.id, reason="recovery"))
    return view(new)


def _resume(run: RunRecord) -> RunView:
    """Start the retained machine and move the run back to training (issue 19.3). The agent, stopped
    by a heartbeat reply while its trainer had a checkpoint, hears `resume: true` in its next reply
    and runs the trainer again from that checkpoint (shared/agent/main.py); on the local provider a
    trainer frozen mid-step by the retain simply continues. The runtime limit and the heartbeat
    deadline count again from now: the old ones have passed, or the run would not be retained."""
    if run.provider != "local":
        # A cloud machine's stop ends its processes, and its restarted agent does not ask for a resume
        # yet: moving the run to training would only bill the GPU until the heartbeat deadline.
        raise Conflict(f"resume is not available on {run.provider} yet, only on the local provider; recover "
                       "with mode verify_saved (the last checkpoint's adapter is in storage) instead")
    try:
        outcome = compute_for(run.org, run.provider).start(ref_of(run), run.resources)
    except ProviderError as exc:
        raise Conflict(f"the cloud refused to start the machine: {redact_text(exc.reason)}; the run stays "
                       "retained: try mode resume again later, or recover with mode verify_saved") from exc
    t = now()

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.retained:
            return None
        r = transition(r, RunState.training, reason="resumed from the last checkpoint")
        deadlines = r.deadlines.model_copy(update={
            "runtime_by": t + timedelta(seconds=r.runtime_limit_s),
            "heartbeat_by": t + timedelta(seconds=get_settings().heartbeat_timeout_s)})
        return r.model_copy(update={"deadlines": deadlines, "machine_started_at": None,
                                    "billing_note": outcome.billing_note or r.billing_note})

    new, wrote = get_store().mutate_run(run.org, run.id, change)
    if wrote:
        transition_event(RunState.retained, new)
        event(new, "audit", "machine started to resume training from the last checkpoint", detail=outcome.detail)
    return view(new)


def retry_release(principal: Principal, run_id: str) -> RunView:
    require(principal, Role.owner, Role.member)
    run, _ = get_store().get_run(principal.org, run_id)
    if run.state != RunState.releasing:
        raise Conflict(f"only a run in releasing can retry its release; this one is {run.state.value}")
    quotas.take(principal, "release")
    event(run, "audit", f"release retry requested by {principal.sub}")
    get_queues().send(Step.release, StepMessage(org=run.org, run_id=run.id, reason="retry"))
    return view(run)


# ---------------------------------------------------------------- the adapter (issue 10)

ADAPTER_URL_TTL_S = 15 * 60  # long enough to start a download, short enough that a leaked link dies soon


@dataclass(frozen=True)
class AdapterStream:
    """The adapter archive itself (local storage has no URLs), checked against the verified sha256."""

    data: bytes
    sha256: str
    filename: str


def adapter(principal: Principal, run_id: str) -> AdapterStream | dict[str, Any]:
    """The verified adapter of a succeeded run: its bytes (local storage) or a short-lived URL."""
    require(principal, Role.owner, Role.member)
    run, _ = get_store().get_run(principal.org, run_id)
    if run.state != RunState.succeeded or not run.adapter_sha256:
        raise Conflict(f"the adapter is not available: the run is {run.state.value}; it can be downloaded once "
                       "the run has succeeded with a verified adapter")
    storage = storage_for(run.org)
    key = adapter_key(run.id)
    url = storage.download_url(key, ADAPTER_URL_TTL_S)
    if url is not None:
        event(run, "audit", f"adapter download link issued to {principal.sub} (valid {ADAPTER_URL_TTL_S // 60} min)")
        return {"url": url, "expires_at": now() + timedelta(seconds=ADAPTER_URL_TTL_S),
                "sha256": run.adapter_sha256, "size": run.adapter_size}
    try:
        data = storage.get(key, MAX_UPLOAD)
    except ObjectMissing as exc:
        raise Conflict("the verified adapter is no longer in the organization's storage (deleted outside the "
                       "control plane?)") from exc
    sha = hashlib.sha256(data).hexdigest()
    if sha != run.adapter_sha256:
        # Never hand out bytes that are not the ones the verifier accepted.
        raise Conflict(f"the stored adapter has changed since it was verified (sha256 {sha[:12]}..., verified "
                       f"{run.adapter_sha256[:12]}...); it is not served")
    return AdapterStream(data=data, sha256=sha, filename=f"{run.id}-adapter.zip")


# ---------------------------------------------------------------- stopping a machine started for recovery


def stop(principal: Principal, run_id: str) -> RunView:
    """Stop a retained run's machine again (provider.retain once more): a machine started for
    recovery bills for its GPU until then. Safe to repeat; the disk is kept."""
    require(principal, Role.owner, Role.member)
    run, _ = get_store().get_run(principal.org, run_id)
    if run.state not in (RunState.retained, RunState.recovering):
        raise Conflict(f"only a retained run's machine can be stopped; this one is {run.state.value}"
                       + ("" if run.state in TERMINAL else " (its machine is the control plane's to stop)"))
    try:
        run = stop_machine(run, why=f"stopped by {principal.sub}")
    except ProviderError as exc:
        raise Conflict(f"the cloud refused to stop the machine: {redact_text(exc.reason)}; it may still be "
                       "billing: try again, or stop it in the cloud console") from exc
    return view(run)


def stop_machine(run: RunRecord, *, why: str) -> RunRecord:
    """provider.retain on a retained run's machine; clears machine_started_at once the cloud confirms.
    Raises ProviderError. Used by stop() and heartbeat-check's idle stop."""
    from shared.runs.resources import merge_resources

    resources = merge_resources(get_store().list_ledger(run.id), run.resources)
    out = compute_for(run.org, run.provider).retain(ref_of(run), resources)
    if out.done:
        note = out.billing_note or "the machine is stopped; its disk still bills"
        update: dict[str, Any] = {"billing_note": note, "machine_started_at": None}
    else:
        # Left started: a repeated stop (or the idle stop) asks the cloud again.
        note = f"the machine is stopping; the cloud has not confirmed it yet ({out.detail or 'no detail'})"
        update = {"billing_note": note}
    event(run, "audit", f"{why}: {note}", detail=out.detail)

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in (RunState.retained, RunState.recovering):
            return None
        return r.model_copy(update={**update, "updated_at": now()})

    return get_store().mutate_run(run.org, run.id, change)[0]


def adapter_for_use(run: RunRecord, max_bytes: int = MAX_UPLOAD) -> bytes:
    """The run's adapter archive as stored, refused unless its sha256 is the one recorded at
    completion (the agent's report) or recovery. The agent's presigned upload URL outlives the
    run, so an archive written after verification must never be served or verified as the run's."""
    if not run.adapter_sha256:
        raise Conflict("the run has no recorded adapter sha256; verify or recover it first")
    data = storage_for(run.org).get(adapter_key(run.id), max_bytes)
    actual = hashlib.sha256(data).hexdigest()
    if actual != run.adapter_sha256:
        event(run, "warning", "the stored adapter archive changed after it was recorded", expected=run.adapter_sha256,
              actual=actual)
        raise Conflict(f"the stored adapter archive (sha256 {actual}) is not the one recorded for this run "
                       f"(sha256 {run.adapter_sha256}): it was replaced after the run reported it, and is refused")
    return data
