"""What the agent on the machine reports: heartbeats (phase, progress, logs) and completion.

Agent tokens are short-lived (settings.agent_token_ttl_s) and renewed through heartbeat
replies while the run is active; a run that has ended refuses its agent's calls whatever
the token's expiry (issue 11.10). A failed completion retains the machine only where it may
hold recoverable output; otherwise the run is released and failed (issue 12.5).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shared.clock import now, now_ts
from shared.errors import Conflict, InvalidInput, Unauthorized
from shared.models import AgentComplete, Heartbeat, Outcome, RunRecord, RunState, StepMessage
from shared.queues import get_queues
from shared.runs.lifecycle import ACTIVE, PHASE_ORDER, TERMINAL, transition
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


def refuse_ended(run: RunRecord) -> None:
    """An ended run's agent token no longer authenticates, whatever its expiry."""
    if run.state in TERMINAL:
        raise Unauthorized(f"the run is {run.state.value}: its agent token is no longer accepted")


def heartbeat(org: str, run_id: str, hb: Heartbeat, *, token_exp: float | None = None) -> dict[str, Any]:
    """`token_exp`: the expiry of the token the agent sent; a fresh one is handed out in the reply
    while the run is active and less than half of a token's lifetime is left."""
    store = get_store()
    t = now()
    stored = store.get_run(org, run_id)[0]
    refuse_ended(stored)
    before = stored.state
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
    reply: dict[str, Any] = {"state": run.state.value, "stop": run.state not in ACTIVE}
    ttl = get_settings().agent_token_ttl_s
    if run.state in ACTIVE and token_exp is not None and token_exp - now_ts() < ttl / 2:
        from shared.security import mint_agent_token

        reply["token"] = mint_agent_token(org, run_id, ttl_s=ttl)
        reply["token_expires_at"] = (t + timedelta(seconds=ttl)).isoformat()
    return reply


def _failure_reason(body: AgentComplete) -> str:
    if body.exit_code == 0:
        # Not "training failed (exit code 0)": the trainer said it succeeded but left no adapter.
        head = "the trainer exited with code 0 but wrote no adapter"
    else:
        head = "training failed" + (f" (exit code {body.exit_code})" if body.exit_code is not None else "")
    return f"{head}: {body.reason or 'no reason given'}"


def _last_lines(body: AgentComplete) -> str:
    lines = [line for line in body.last_lines if line.strip()][-10:]
    return ("; the trainer's last lines:\n" + "\n".join(lines)) if lines else ""


def complete(org: str, run_id: str, body: AgentComplete) -> dict[str, Any]:
    store = get_store()
    run, _ = store.get_run(org, run_id)
    refuse_ended(run)
    before = run.state
    if body.status == "ok" and not body.sha256:
        raise InvalidInput.field("sha256", "a successful completion reports the adapter archive's sha256")

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in ACTIVE:
            return None
        if body.status == "ok":
            r = _walk(r, RunState.verifying)
            return r.model_copy(update={"adapter_sha256": body.sha256, "adapter_size": body.size, "progress": 1.0})
        if body.output_exists is False:
            # Nothing on the machine to recover: keeping its disk would only bill.
            return transition(r, RunState.releasing, outcome=Outcome.failed, reason=(
                _failure_reason(body) + "; the trainer left no output to recover, so the machine and disk are "
                "released" + _last_lines(body))[:4000])
        return transition(r, RunState.retaining, reason=_failure_reason(body) + "; the machine is stopped and its "
                          "disk kept so output can be recovered" + _last_lines(body)[:2000])

    run, wrote = store.mutate_run(org, run_id, change)
    repeated = run.state in (RunState.verifying, RunState.retaining) or (
        run.state == RunState.releasing and run.outcome == Outcome.failed and body.status == "failed")
    if not wrote and not repeated and before not in ACTIVE:
        raise Conflict(f"the run is {run.state.value}; it no longer takes a completion")
    if wrote:
        transition_event(before, run)
    # Re-sent on a repeated completion too: the step ignores a run that has moved on.
    if run.state == RunState.verifying:
        get_queues().send(Step.verify_adapter, StepMessage(org=org, run_id=run_id))
    elif run.state == RunState.retaining:
        get_queues().send(Step.retain, StepMessage(org=org, run_id=run_id))
    elif run.state == RunState.releasing and (wrote or repeated):
        get_queues().send(Step.release, StepMessage(org=org, run_id=run_id))
    return {"state": run.state.value}
