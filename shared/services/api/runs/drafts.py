"""Drafts: create, edit and delete a run before launch (nothing is rented for a draft). Every
create, edit and estimate passes the same admission (shared/runs/admission.py), called once."""

from __future__ import annotations

from functools import partial
from typing import Any

from pydantic import ValidationError

from shared.clock import now
from shared.context import Context
from shared.errors import Conflict, InvalidInput, invalid
from shared.ids import newest_first_id
from shared.lifecycle import TERMINAL
from shared.models import (
    Billing,
    DatasetVersionRecord,
    Role,
    RunCreate,
    RunEstimate,
    RunKind,
    RunPatch,
    RunRecord,
    RunState,
    RunView,
)
from shared.runs import admission, forecast
from shared.runs.admission import TRIAL_MAX_EXAMPLES, TRIAL_MAX_STEPS, TRIAL_RUNTIME_LIMIT_S, Admitted
from shared.runs.candidates import dearest_price
from shared.runs.events import event
from shared.security import Principal, require
from shared.services.api import quotas
from shared.services.api.org_secrets import hf_token
from shared.services.api.runs.view import view, warnings_of


def _draft_fields(body: RunCreate, checked: Admitted) -> dict[str, Any]:
    """What a draft stores of a checked request (create and edit alike)."""
    return {
        "kind": body.kind, "provider": body.provider, "offer": checked.offer,
        "price_limit_per_hour": body.price_limit_per_hour, "runtime_limit_s": checked.runtime_limit_s,
        "dataset_version_id": body.dataset_version_id, "base_model": body.base_model, "training": checked.training,
        "validation_dataset_version_id": body.validation_dataset_version_id or "",
        "base_model_revision": checked.base_model_revision,
        "forecast": checked.forecast,
        # Candidates (issue 37): stored when the request named more than its own offer.
        "candidates": checked.candidates if body.candidates or body.fallback != "none" else [],
        "candidate_index": 0, "capacity_wait_s": body.capacity_wait_s,
        "connection": "" if checked.candidates[0].connection == body.provider else checked.candidates[0].connection,
        # training.kind is the run's kind (checked above): kept out, so a later kind switch applies.
        "request": body.model_copy(update={"training": body.training.model_copy(update={"kind": None})}),
    }


def _forecast_events(ctx: Context, run: RunRecord, checked: Admitted, source: str = "") -> None:
    """The forecast in the run's history, and why the runtime limit is not the default when it is not."""
    if run.forecast is not None:
        uncertain = f"; {run.forecast.uncertainty}" if run.forecast.uncertainty else ""
        event(ctx, run, "audit", f"forecast: {forecast.summary(run.forecast, run.offer.currency)}{uncertain}; "
              f"{run.forecast.basis}", source=source, **run.forecast.model_dump(exclude={"basis"}))
    if checked.limit_note:
        event(ctx, run, "audit", checked.limit_note, source=source, runtime_limit_s=run.runtime_limit_s)


def _candidates_event(ctx: Context, run: RunRecord, source: str = "") -> None:
    if len(run.candidates) > 1:
        dearest = dearest_price(run)
        event(ctx, run, "audit", f"{len(run.candidates)} candidates, tried in order when a cloud has no capacity, quota "
              "or stock: " + ", ".join(f"{c.connection} {c.offer.offer_id} ({c.offer.gpu}, {c.offer.total_per_hour:g}/h)"
                                       for c in run.candidates)
              + f"; the dearest, {dearest:g}/h, is the price the forecast and the limits use", source=source)


def _kind_event(ctx: Context, run: RunRecord, dataset: DatasetVersionRecord, source: str = "") -> None:
    if run.kind == RunKind.trial:
        event(ctx, run, "audit", f"trial run: trains on at most {run.training.max_examples} of the dataset's "
                            f"{dataset.rows} examples and {run.training.max_steps} steps, runtime limit "
                            f"{run.runtime_limit_s // 60} min; a full run uses the whole dataset",
              source=source, max_examples=run.training.max_examples, max_steps=run.training.max_steps)
    else:
        event(ctx, run, "audit", f"full run: trains on all {dataset.rows} examples, runtime limit "
                            f"{run.runtime_limit_s // 60} min", source=source)


def create(ctx: Context, principal: Principal, body: RunCreate) -> RunView:
    require(principal, Role.owner, Role.member)
    checked = admission.admit(ctx, principal.org, body, partial(hf_token, ctx),
                              charge=lambda limits: quotas.take_create(ctx, principal, limits))
    t = now()
    run = RunRecord(
        org=principal.org, id=newest_first_id("r"), project_id=body.project_id, created_at=t, updated_at=t,
        state_changed_at=t, created_by=principal.sub, billing=Billing(), **_draft_fields(body, checked),
    )
    ctx.store.runs.create(run)
    event(ctx, run, "transition", "draft saved; nothing is rented until launch",
          estimate_per_hour=checked.offer.total_per_hour)
    _candidates_event(ctx, run)
    _kind_event(ctx, run, checked.dataset)
    _forecast_events(ctx, run, checked)
    for warning in warnings_of(ctx, run):
        event(ctx, run, "warning", warning)
    return view(ctx, run)


def estimate(ctx: Context, principal: Principal, body: RunCreate) -> RunEstimate:
    """The draft a create of `body` would save, checked the same way, but not saved and not rate
    limited (a form asks at each change): its offer, runtime limit, forecast and warnings."""
    require(principal, Role.owner, Role.member)
    checked = admission.admit(ctx, principal.org, body, partial(hf_token, ctx))  # as at create, not rate limited
    t = now()
    run = RunRecord(org=principal.org, id="estimate", project_id=body.project_id, created_at=t, updated_at=t,
                    state_changed_at=t, created_by=principal.sub, billing=Billing(), **_draft_fields(body, checked))
    return RunEstimate(offer=run.offer, price_limit_per_hour=run.price_limit_per_hour,
                       runtime_limit_s=run.runtime_limit_s,
                       max_cost=round(run.offer.total_per_hour * run.runtime_limit_s / 3600, 4),
                       forecast=checked.forecast, limit_note=checked.limit_note, warnings=warnings_of(ctx, run))


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
                     connection=run.connection or None,
                     price_limit_per_hour=run.price_limit_per_hour, runtime_limit_s=runtime,
                     dataset_version_id=run.dataset_version_id, base_model=run.base_model,
                     base_model_revision=run.base_model_revision or None, training=training,
                     validation_dataset_version_id=run.validation_dataset_version_id or None)


def patch(ctx: Context, principal: Principal, run_id: str, body: RunPatch) -> RunView:
    """Edit a draft: the fields given replace the draft's request (training: the settings given),
    and the result is checked whole, exactly as a create of it would be (so an edit cannot skip a check); a refused
    edit changes nothing."""
    require(principal, Role.owner, Role.member)
    store = ctx.store
    run, _ = store.runs.get(principal.org, run_id)
    if run.state != RunState.draft:
        raise Conflict(f"only a draft can be edited; this run is {run.state.value}")
    fields = body.model_dump(exclude_none=True, exclude={"training"})
    if body.training is not None:
        fields["training"] = body.training.model_dump(exclude_unset=True)
    if not fields:
        raise InvalidInput.field("body", "send at least one field to change (the fields of a run create)")
    if fields.get("validation_dataset_version_id") == "":
        fields["validation_dataset_version_id"] = None  # dropped: the eval split is held out of the training rows
    request = request_of(run)
    if body.candidates and body.provider is None and body.offer_id is None:
        # New candidates without a new provider/offer: the first candidate is the run's own.
        fields["provider"] = body.candidates[0].connection.split("/", 1)[0]
        fields["offer_id"] = body.candidates[0].offer_id
    merged = request.model_dump() | fields
    merged["training"] = request.training.model_dump() | fields.get("training", {})
    try:
        edited = RunCreate.model_validate(merged)
    except ValidationError as exc:
        raise invalid(exc, model=RunCreate) from exc
    checked = admission.admit(ctx, principal.org, edited, partial(hf_token, ctx))  # as at create, not rate limited
    updates = _draft_fields(edited, checked) | {"updated_at": now()}

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.draft:
            return None
        if r != run:
            # Checked as read: an edit in between (say, another model) was not checked with this one.
            raise Conflict("the draft was changed by another request while this edit was checked; nothing was "
                           "changed by this one: read the draft and send the edit again")
        return r.model_copy(update=updates)

    new, wrote = store.runs.mutate(principal.org, run_id, change)
    if not wrote:
        raise Conflict(f"only a draft can be edited; this run is {new.state.value} now")
    # Edits are the user's to repeat at will: their events are bounded per run (shared/runs/events.py).
    event(ctx, new, "audit", f"draft edited by {principal.sub}: {', '.join(sorted(fields))}", source="edit")
    if new.kind != run.kind or new.training != run.training or new.runtime_limit_s != run.runtime_limit_s:
        _kind_event(ctx, new, checked.dataset, source="edit")
    if new.forecast != run.forecast or new.runtime_limit_s != run.runtime_limit_s:
        _forecast_events(ctx, new, checked, source="edit")
    for warning in warnings_of(ctx, new):
        event(ctx, new, "warning", warning, source="edit")
    return view(ctx, new)


def delete(ctx: Context, principal: Principal, run_id: str) -> None:
    """Delete a draft (nothing was rented for it); any other run is kept as a record."""
    require(principal, Role.owner, Role.member)
    store = ctx.store
    run, etag = store.runs.get(principal.org, run_id)
    if run.state in TERMINAL:
        # "Cancel it instead" sent the owner of a succeeded run to a command that does nothing for it.
        raise Conflict(f"only a draft can be deleted; this run is {run.state.value}, and an ended run stays as "
                       "the record of what it trained and billed (nothing of it runs or bills now)")
    if run.state != RunState.draft:
        raise Conflict(f"only a draft can be deleted; this run is {run.state.value}: cancel it instead "
                       f"(`tensorant runs cancel {run.id} --discard --yes` deletes its machine and disk with any "
                       f"output on them; `--keep` keeps the disk for recovery), and it stays as the record of what "
                       "was billed")
    store.runs.delete(run.org, run.id, etag)  # ETag-guarded: a launch in between wins
    return None
