"""The run view (GET /api/runs/{id} and the list): state, phase, progress, estimate and cost so far,
resources with their current state, the timeline's latest events, warnings."""

from __future__ import annotations

from typing import Any

from shared.context import Context
from shared.errors import InvalidInput
from shared.lifecycle import ACTIVE, TERMINAL
from shared.models import CloudResource, RunEvent, RunRecord, RunState, RunView
from shared.runs import forecast
from shared.runs.candidates import candidates_of, dearest_offer, dearest_price, ran_on, view_of
from shared.runs.events import pending_transition
from shared.runs.org_limits import get_limits
from shared.runs.resources import MACHINE_KINDS
from shared.runs.retention import retention_note
from shared.security import Principal
from shared.services.api import paging, usage

# A run view reads bounded pages of events (its timeline), never the whole partition: the first half
# oldest first, and when there are more, the newest half (a succeeded run whose 200 first events were
# boot-failure reports showed no launch transition).
VIEW_EVENTS = 200


def resource_states(run: RunRecord, t: usage.Timing) -> list[CloudResource]:
    """Each recorded resource with its current state, from where the run is now.

    The state recorded at launch ("running") goes stale: the run's state says what the
    steps have done to the machine since (stopped and kept, being released, released).
    """
    return [res.model_copy(update={"state": _resource_state(run, t, res)}) for res in run.resources]


def _resource_state(run: RunRecord, t: usage.Timing, res: CloudResource) -> str:
    machine = res.kind in MACHINE_KINDS
    if run.state in TERMINAL or t.released_at is not None:
        return "released"
    if run.state == RunState.releasing:
        return "releasing"
    if run.state == RunState.retaining:
        return "stopping" if machine else "kept"
    if run.state in (RunState.retained, RunState.recovering):
        if not machine:
            return "kept"
        # A retained run's machine runs only while started for recovery: machine_started_at, set at
        # the start and cleared when the cloud confirms a stop (as heartbeat-check reads it).
        started = t.machine_running and (run.state == RunState.recovering or run.machine_started_at is not None)
        return "running (started for recovery)" if started else "stopped"
    return (res.state or "running") if machine else "in use"


def warnings_of(ctx: Context, run: RunRecord, *, retention: bool = False) -> list[str]:
    """A draft's limits that will refuse or not cover it; with `retention`, until when a retained run is kept."""
    if run.state == RunState.retained and retention:
        return [retention_note(run, get_limits(ctx, run.org))]
    if run.state != RunState.draft:
        return []
    out = []
    dearest = dearest_offer(run)
    if dearest.total_per_hour > run.price_limit_per_hour:
        out.append(f"the estimate {dearest.total_per_hour:.4f} {dearest.currency}/h is above the price limit "
                   f"{run.price_limit_per_hour:.4f}/h: launch will be refused until price_limit_per_hour is raised "
                   "or another offer is chosen")
    if run.forecast is not None:  # limits that will not cover the forecast: a warning, not a refusal
        out += forecast.warnings(run.forecast, run.price_limit_per_hour, run.runtime_limit_s, run.offer.currency)
    return out


def timeline(ctx: Context, run_id: str) -> list[RunEvent]:
    """The first VIEW_EVENTS // 2 events and, when there are more, the newest VIEW_EVENTS // 2, each once."""
    store, half = ctx.store, VIEW_EVENTS // 2
    first = store.events.read(run_id, exclude_kind="log", limit=half)
    if len(first) < half:
        return first
    newest = [e for e in store.events.newest(run_id, exclude_kind="log", limit=half) if e not in first]
    return first + newest


def view(ctx: Context, run: RunRecord, with_events: bool = True) -> RunView:
    events = timeline(ctx, run.id) if with_events else []
    pending = pending_transition(run, events) if with_events else None
    if pending is not None:
        events.append(pending)
    t = usage.timing(ctx, run, [] if run.state == RunState.draft else (events if with_events else None))
    return RunView(
        id=run.id, org=run.org, project_id=run.project_id, kind=run.kind, provider=run.provider, state=run.state,
        outcome=run.outcome, phase=run.phase if run.state in ACTIVE else "", progress=run.progress,
        reason=run.reason, billing_note=run.billing_note,
        offer=run.offer,
        # Before a machine ran: the dearest candidate's price (the launch may end on it); then the price it runs at.
        estimate_per_hour=run.offer.total_per_hour if ran_on(run) or not run.candidates else dearest_price(run),
        price_limit_per_hour=run.price_limit_per_hour,
        runtime_limit_s=run.runtime_limit_s, base_model=run.base_model, dataset_version_id=run.dataset_version_id,
        validation_dataset_version_id=run.validation_dataset_version_id,
        base_model_revision=run.base_model_revision,
        resources=resource_states(run, t), adapter_sha256=run.adapter_sha256, release_error=run.release_error,
        release_attempts=run.release_attempts, created_at=run.created_at, updated_at=run.updated_at, events=events,
        training=run.training,
        started_at=t.started_at, machine_up_at=t.machine_up_at, released_at=t.released_at, elapsed_s=t.elapsed_s,
        billed_machine_s=t.machine_s, billed_disk_only_s=t.disk_only_s, cost_so_far=t.cost,
        final_cost=t.final_cost, warnings=warnings_of(ctx, run, retention=with_events), forecast=run.forecast,
        forecast_check=run.forecast_check, adapter_kind=run.adapter_kind, checkpoint_step=run.checkpoint_step,
        planned_steps=run.planned_steps, merged_sha256=run.merged_sha256, merged_size=run.merged_size,
        merged_note=run.merged_note, candidates=[view_of(c) for c in candidates_of(run)], attempts=run.attempts,
        ran_on=ran_on(run), adapter_saved=run.adapter_saved if run.state == RunState.retained else None,
    )


def get(ctx: Context, principal: Principal, run_id: str) -> RunView:
    run, _ = ctx.store.runs.get(principal.org, run_id)
    return view(ctx, run)


def _states(state: str | None) -> frozenset[RunState] | None:
    if not state:
        return None
    try:
        return frozenset(RunState(s.strip()) for s in state.split(",") if s.strip()) or None
    except ValueError:
        raise InvalidInput.field("state", "run states separated by commas, of: "
                                 + ", ".join(s.value for s in RunState)) from None


def list_runs(ctx: Context, principal: Principal, *, limit: str | None = None, cursor: str | None = None,
              state: str | None = None, project: str | None = None) -> dict[str, Any]:
    """One page of the org's runs, newest first (`next`: the cursor of the following page, null on the
    last), filtered by state (comma-separated) and project. One query of the runs table per page (a
    page the service answers short is filled by a few more): the items' time and cost are on each
    record, so no event is read (only for a record from before that: usage.timing)."""
    states = _states(state)
    filters = (",".join(sorted(s.value for s in states)) if states else "", project or "")
    page = paging.request(ctx, limit, cursor, "runs", principal.org, *filters)
    runs, nxt = ctx.store.runs.page(principal.org, limit=page.limit, after=page.after, states=states,
                                           project=project or None)
    return {"items": [view(ctx, r, with_events=False) for r in runs],
            "next": paging.cursor_for(ctx, nxt, "runs", principal.org, *filters)}
