"""heartbeat-check: deadlines per phase, and re-sending messages a crash may have lost.

Every limit is enforced here, by the control plane; no provider-side timer is trusted
to stop billing. Deadlines (set on the run):
- provisioning_by, the boot deadline: the agent must report before it (machine start and
  image pull included). A machine that misses it never started training, so nothing on it
  can be recovered: the run is released and failed, not retained, and the release step adds
  the cloud's account of the machine to the reason (shared/services/boot.py);
- heartbeat_by: pushed forward by every heartbeat; silence past it means the agent is gone;
- runtime_by: the run's total runtime limit, counted from launch.
A missed deadline after the agent reported retains the run with the reason (the machine is
stopped, the disk kept for recovery). A run still queued at its provisioning deadline never
got a machine (the launch step writes provisioning before any cloud call), so it fails with
nothing to release. Whether the machine still exists is the retain step's question: one that
vanished outside the control plane fails the run with "nothing to retain or release".

A retained machine started for recovery bills for its GPU: it is stopped again once it has
been up settings.recovery_idle_stop_s, with a warning event.

One query per tick (the runs in the states watched), a write only for a run that acts.
"""

from __future__ import annotations

from datetime import datetime

from shared.clock import now
from shared.errors import ProviderError
from shared.log import redact_text
from shared.models import Outcome, RunRecord, RunState, StepMessage
from shared.queues import get_queues
from shared.runs.cloud_account import BOOT_FAILED
from shared.runs.events import event
from shared.runs.lifecycle import ACTIVE, transition
from shared.runs.machine import stop_machine
from shared.runs.moves import move, move_run
from shared.runs.steps import Resender, Step, resent_by
from shared.settings import get_settings
from shared.store import get_store

# A run sitting in one of these states this long without any write lost its message (a
# crash between the write and the send, or a poisoned message): send it again, at most
# once per this interval (the resend touches updated_at); the steps ignore duplicates.
# Which step serves which state is the step table's (releasing is the sweeper's, with backoff).
RESEND_AFTER_S = 300
RESEND: dict[RunState, Step] = resent_by(Resender.heartbeat_check)

# A run still verifying (or recovering) this long after it got there has a verify-adapter
# step that keeps failing (storage unreachable, a message poisoned and re-sent above): the
# re-sends alone would keep a verifying run's machine billing for ever. Give up: verifying
# -> retaining (stop it, keep the disk), recovering -> retained, with the last step error.
VERIFY_LIMIT_S = 1800
# Keyed by the states the verify-adapter step serves (tests/test_steps.py checks they agree).
VERIFY_GIVE_UP = {RunState.verifying: RunState.retaining, RunState.recovering: RunState.retained}


def missed_deadline(run: RunRecord, t: datetime) -> str | None:
    d = run.deadlines
    if d.runtime_by and t > d.runtime_by:
        return f"the run's runtime limit of {run.runtime_limit_s} s was reached"
    if run.state == RunState.provisioning and d.provisioning_by and t > d.provisioning_by:
        return (f"the agent did not report within the boot deadline of {get_settings().provisioning_timeout_s} s "
                "(TENSORANT_PROVISIONING_TIMEOUT_S: machine start and image pull included)" + _refused(run))
    if run.state in ACTIVE and run.state != RunState.provisioning and d.heartbeat_by and t > d.heartbeat_by:
        return "the agent's heartbeat went silent" + _refused(run)
    return None


def _refused(run: RunRecord) -> str:
    if not run.agent_refused:
        return ""
    return (f"; its calls were refused: {run.agent_refused} (was TENSORANT_JWT_SECRET changed without "
            "TENSORANT_JWT_SECRET_PREVIOUS?)")


def check_all() -> dict[str, int]:
    store, t = get_store(), now()
    counts = {"retained": 0, "failed": 0, "resent": 0, "stopped": 0}
    idle_stop_s = get_settings().recovery_idle_stop_s
    for run in store.list_runs_all_orgs(states=set(ACTIVE) | set(RESEND) | {RunState.retained}):
        why = missed_deadline(run, t) if run.state in ACTIVE else None
        if run.state == RunState.retained:
            started = run.machine_started_at
            if started is not None and (t - started).total_seconds() > idle_stop_s:
                counts["stopped"] += _stop_idle_machine(run, idle_stop_s)
        elif why and run.state == RunState.provisioning:
            counts["failed"] += _release_unstarted(run, why)
        elif why:
            counts["retained"] += _retain(run, why)
        elif run.state == RunState.queued and run.deadlines.provisioning_by and t > run.deadlines.provisioning_by:
            counts["failed"] += _fail_queued(run)
        elif run.state in VERIFY_GIVE_UP and (t - run.state_changed_at).total_seconds() > VERIFY_LIMIT_S:
            counts["retained"] += _give_up_verify(run)
        elif run.state in RESEND and _quiet_for(run, t) > RESEND_AFTER_S:
            if run.state == RunState.provisioning and run.resources:
                continue  # launched; waiting for the agent is the deadlines' job
            counts["resent"] += _resend(run, t)
    return counts


def _quiet_for(run: RunRecord, t: datetime) -> float:
    return (t - max(run.state_changed_at, run.updated_at)).total_seconds()


def _retain(run: RunRecord, why: str) -> int:
    _, wrote = move(run, RunState.retaining, expect=ACTIVE, reason=why + "; the machine is stopped and its disk kept")
    if not wrote:
        return 0
    get_queues().send(Step.retain, StepMessage(org=run.org, run_id=run.id, reason="deadline"))
    return 1


def _release_unstarted(run: RunRecord, why: str) -> int:
    _, wrote = move(run, RunState.releasing, expect={RunState.provisioning}, outcome=Outcome.failed,
                    reason=why + "; nothing ran on the machine, so it is released with its disk, not kept")
    if not wrote:
        return 0
    get_queues().send(Step.release, StepMessage(org=run.org, run_id=run.id, reason=BOOT_FAILED))
    return 1


def _give_up_verify(run: RunRecord) -> int:
    errors = [e.message for e in get_store().list_events(run.id, kind="step-error")]
    why = f"the adapter could not be verified within {VERIFY_LIMIT_S // 60} min"
    why += f" (last error: {errors[-1]})" if errors else ""
    if run.state == RunState.verifying:
        why += "; the machine is stopped and its disk kept: recover once the cause is fixed"
    else:
        why += "; the machine and disk are still retained: recover again once the cause is fixed, or cancel " \
               "with discard"
    since = run.state_changed_at

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != run.state or r.state_changed_at != since:
            return None
        return transition(r, VERIFY_GIVE_UP[r.state], reason=why)

    new, wrote = move_run(run.org, run.id, change)
    if not wrote:
        return 0
    if new.state == RunState.retaining:
        get_queues().send(Step.retain, StepMessage(org=run.org, run_id=run.id, reason="verify-timeout"))
    return 1


def _fail_queued(run: RunRecord) -> int:
    _, wrote = move(run, RunState.releasing, expect={RunState.queued}, outcome=Outcome.failed,
                    reason="the launch never started before the provisioning deadline; no machine was created, "
                           "nothing bills")
    if not wrote:
        return 0
    get_queues().send(Step.release, StepMessage(org=run.org, run_id=run.id, reason="deadline"))
    return 1


def _resend(run: RunRecord, t: datetime) -> int:
    seen = run.updated_at

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != run.state or r.updated_at != seen:
            return None  # it moved or was written meanwhile: not lost
        return r.model_copy(update={"updated_at": t})

    _, wrote = get_store().mutate_run(run.org, run.id, change)
    if not wrote:
        return 0
    # Written before sent: a crash in between delays the resend by one interval, never loses it.
    get_queues().send(RESEND[run.state], StepMessage(org=run.org, run_id=run.id, reason="resend"))
    return 1


def _stop_idle_machine(run: RunRecord, idle_stop_s: int) -> int:
    why = (f"the machine started for recovery was stopped automatically after {idle_stop_s} s "
           "(TENSORANT_RECOVERY_IDLE_STOP_S); start it again with recover mode start_machine if you need it")
    try:
        new = stop_machine(run, why="idle stop")
    except ProviderError as exc:
        event(run, "warning", f"the idle stop of the machine started for recovery failed: {redact_text(exc.reason)}; "
              "it may still be billing; the next tick tries again")
        return 0
    event(new, "warning", why)
    return 1 if new.machine_started_at is None else 0
