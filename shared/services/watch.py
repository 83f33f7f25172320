"""heartbeat-check: deadlines per phase, and re-sending messages a crash may have lost.

Every limit is enforced here, by the control plane; no provider-side timer is trusted
to stop billing. A missed deadline retains the run (the disk is kept for recovery).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from shared.clock import now
from shared.models import RunRecord, RunState, StepMessage
from shared.queues import Queue, get_queues
from shared.runs.lifecycle import ACTIVE, transition
from shared.services.common import transition_event
from shared.store import get_store

# A run sitting in one of these states longer than this lost its message (a crash
# between the write and the send): send it again; the steps ignore duplicates.
RESEND_AFTER_S = 300
RESEND = {
    RunState.queued: Queue.launch,
    RunState.provisioning: Queue.launch,
    RunState.verifying: Queue.verify_adapter,
    RunState.recovering: Queue.verify_adapter,
    RunState.retaining: Queue.retain,
}


def missed_deadline(run: RunRecord, t: datetime) -> str | None:
    d = run.deadlines
    if d.runtime_by and t > d.runtime_by:
        return f"the run's runtime limit of {run.runtime_limit_s} s was reached"
    if run.state == RunState.provisioning and d.provisioning_by and t > d.provisioning_by:
        return "the machine did not start the agent before the provisioning deadline (image pull included)"
    if run.state in ACTIVE and run.state != RunState.provisioning and d.heartbeat_by and t > d.heartbeat_by:
        return "the agent's heartbeat went silent"
    return None


def check_all() -> dict[str, int]:
    store, queues, t = get_store(), get_queues(), now()
    retained = resent = 0
    for run in store.list_runs(states=set(ACTIVE) | set(RESEND)):
        why = missed_deadline(run, t) if run.state in ACTIVE else None
        if why:
            def change(r: RunRecord, why: str = why) -> RunRecord | None:
                if r.state not in ACTIVE:
                    return None
                return transition(r, RunState.retaining, reason=why + "; the machine is stopped and its disk kept")

            new, wrote = store.mutate_run(run.org, run.id, change)
            if wrote:
                transition_event(run.state, new)
                queues.send(Queue.retain, StepMessage(org=run.org, run_id=run.id))
                retained += 1
            continue
        if run.state in RESEND and (t - run.state_changed_at) > timedelta(seconds=RESEND_AFTER_S):
            if run.state == RunState.provisioning and run.resources:
                continue  # launched; waiting for the agent is the deadlines' job
            queues.send(RESEND[run.state], StepMessage(org=run.org, run_id=run.id, reason="resend"))
            resent += 1
    return {"retained": retained, "resent": resent}
