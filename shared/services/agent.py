"""What the agent on the machine reports: heartbeats (phase, progress, logs) and completion."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shared.clock import now
from shared.errors import Conflict, InvalidInput
from shared.models import AgentComplete, Heartbeat, RunRecord, RunState, StepMessage
from shared.queues import get_queues
from shared.runs.lifecycle import ACTIVE, PHASE_ORDER, transition
from shared.runs.steps import Step
from shared.services.run_events import event, transition_event
from shared.settings import get_settings
from shared.store import get_store


def _walk(run: RunRecord, target: RunState) -> RunRecord:
    """Move forward through the phase order to target; never back."""
    while PHASE_ORDER.index(run.state) < PHASE_ORDER.index(target):
        nxt = PHASE_ORDER[PHASE_ORDER.index(run.state) + 1]
        run = transition(run, nxt, reason="")
    return run


def heartbeat(org: str, run_id: str, hb: Heartbeat) -> dict[str, Any]:
    store = get_store()
    t = now()
    before = store.get_run(org, run_id)[0].state
    target = RunState(hb.phase)

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in ACTIVE:
            return None
        if PHASE_ORDER.index(target) > PHASE_ORDER.index(r.state):
            r = _walk(r, target)
        return r.model_copy(update={
            "phase": hb.phase, "progress": max(hb.progress, r.progress if r.state == target else 0.0),
            "last_heartbeat_at": t, "updated_at": t, "log_lines": r.log_lines + len(hb.logs),
            "deadlines": r.deadlines.model_copy(
                update={"heartbeat_by": t + timedelta(seconds=get_settings().heartbeat_timeout_s)}),
        })

    run, wrote = store.mutate_run(org, run_id, change)
    if wrote and run.state != before:
        transition_event(before, run)
    if wrote and hb.logs:
        event(run, "log", f"{len(hb.logs)} lines", lines=hb.logs)
    return {"state": run.state.value, "stop": run.state not in ACTIVE}


def complete(org: str, run_id: str, body: AgentComplete) -> dict[str, Any]:
    store = get_store()
    run, _ = store.get_run(org, run_id)
    before = run.state
    if body.status == "ok" and not body.sha256:
        raise InvalidInput.field("sha256", "a successful completion reports the adapter archive's sha256")

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in ACTIVE:
            return None
        if body.status == "ok":
            r = _walk(r, RunState.verifying)
            return r.model_copy(update={"adapter_sha256": body.sha256, "adapter_size": body.size, "progress": 1.0})
        code = f" (exit code {body.exit_code})" if body.exit_code is not None else ""
        return transition(r, RunState.retaining, reason=f"training failed{code}: {body.reason or 'no reason given'}; "
                          "the machine is stopped and its disk kept so output can be recovered")

    run, wrote = store.mutate_run(org, run_id, change)
    if not wrote and run.state not in (RunState.verifying, RunState.retaining) and before not in ACTIVE:
        raise Conflict(f"the run is {run.state.value}; it no longer takes a completion")
    if wrote:
        transition_event(before, run)
    # Re-sent on a repeated completion too: the step ignores a run that has moved on.
    if run.state == RunState.verifying:
        get_queues().send(Step.verify_adapter, StepMessage(org=org, run_id=run_id))
    elif run.state == RunState.retaining:
        get_queues().send(Step.retain, StepMessage(org=org, run_id=run_id))
    return {"state": run.state.value}
