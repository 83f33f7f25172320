"""A machine that never started training: its own failure report, and the cloud's account of it.

Two ways a start fails, both released (never retained: nothing ran, nothing can be recovered):
- the machine reports it (POST /api/agent/runs/{id}/boot-failed from the bootstrap script of
  shared/providers/cloudinit.py): the pull, the container start or the agent failed. Accepted
  only while the run is provisioning, i.e. its agent never reported; afterwards the agent's own
  reports and the heartbeat deadline decide, and the report is kept as an event only.
- it stays silent past the boot deadline (heartbeat-check, settings.provisioning_timeout_s).
The release step then adds what the cloud says of the machine (EC2 state reason and console
output, Azure instance view and boot diagnostics, RunPod pod status) before deleting it
(shared/runs/cloud_account.py).
"""

from __future__ import annotations

from typing import Any

from shared.log import redact_text
from shared.models import BootFailure, Outcome, RunState, StepMessage
from shared.queues import get_queues
from shared.runs.cloud_account import BOOT_FAILED
from shared.runs.events import event
from shared.runs.moves import move
from shared.runs.steps import Step
from shared.services.api.agent import refuse_ended
from shared.store import get_store

_STAGES = {
    "pull": "the machine could not pull the training image",
    "start": "the machine could not start the training container",
    "agent": "the training container's agent exited before it reported",
}


def _reason(body: BootFailure) -> str:
    lines = [line for line in body.last_lines if line.strip()][-10:]
    tail = ("; the machine's last lines:\n" + "\n".join(lines)) if lines else ""
    tries = f" after {body.attempts} attempts" if body.attempts > 1 else ""
    return redact_text(f"{_STAGES[body.stage]} (exit code {body.exit_code}{tries}); nothing ran, so the machine "
                       f"and its disk are released{tail}")[:4000]


def boot_failed(org: str, run_id: str, body: BootFailure) -> dict[str, Any]:
    run, _ = get_store().get_run(org, run_id)
    refuse_ended(run)
    if run.state == RunState.provisioning:
        run, wrote = move(run, RunState.releasing, expect={RunState.provisioning}, outcome=Outcome.failed,
                          reason=_reason(body))
        if wrote:
            get_queues().send(Step.release, StepMessage(org=org, run_id=run_id, reason=BOOT_FAILED))
            return {"state": run.state.value}
    if run.state == RunState.releasing and run.outcome == Outcome.failed and run.reason.startswith(_STAGES[body.stage]):
        # The same report again (the script retries when an answer is lost): the message may have been lost too.
        get_queues().send(Step.release, StepMessage(org=org, run_id=run_id, reason=BOOT_FAILED))
        return {"state": run.state.value}
    event(run, "warning", f"the machine reported that {_STAGES[body.stage]} (exit code {body.exit_code}) after the "
          f"agent had reported; the run is {run.state.value} and goes on by the agent's reports and deadlines",
          source="machine")
    return {"state": run.state.value}
