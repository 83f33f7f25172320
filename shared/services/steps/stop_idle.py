"""stop-idle: stop a retained run's machine that was started for recovery and left idle.

heartbeat-check decides (one read of the run per tick) and sends this message, so no timer waits on
a cloud call; this step decides again on the stored run (a recovery may have begun, or a stop may
have confirmed meanwhile), so a duplicate or late delivery does nothing. A stop the cloud has not
confirmed yet leaves machine_started_at set: the next tick sends it again.
"""

from __future__ import annotations

from shared.clock import now
from shared.context import Context
from shared.errors import ProviderError
from shared.log import redact_text
from shared.models import RunState, StepMessage
from shared.runs.events import event
from shared.runs.machine import stop_machine


def idle_for(started_s: float) -> str:
    return (f"the machine started for recovery was stopped automatically after {int(started_s)} s "
            "(TENSORANT_RECOVERY_IDLE_STOP_S); start it again with recover mode start_machine if you need it")


def stop_idle(ctx: Context, msg: StepMessage) -> None:
    run, _ = ctx.store.runs.get(msg.org, msg.run_id)
    idle_stop_s = ctx.settings.recovery_idle_stop_s
    started = run.machine_started_at
    if run.state != RunState.retained or started is None or (now() - started).total_seconds() <= idle_stop_s:
        return  # recovering, stopped already, or started again since the tick looked
    try:
        new = stop_machine(ctx, run, why="idle stop")
    except ProviderError as exc:
        event(ctx, run, "warning", f"the idle stop of the machine started for recovery failed: {redact_text(exc.reason)}; "
              "it may still be billing; the next heartbeat check tries again")
        return
    if new.machine_started_at is None:
        event(ctx, new, "warning", idle_for(idle_stop_s))
