"""A machine that never started training: its own failure report, and the cloud's account of it.

Two ways a start fails, both released (never retained: nothing ran, nothing can be recovered):
- the machine reports it (POST /api/agent/runs/{id}/boot-failed from the bootstrap script of
  shared/providers/cloudinit.py): the pull, the container start or the agent failed. Accepted
  only while the run is provisioning, i.e. its agent never reported; afterwards the agent's own
  reports and the heartbeat deadline decide, and the report is kept as an event only.
- it stays silent past the boot deadline (heartbeat-check, settings.provisioning_timeout_s).
The release step then adds what the cloud says of the machine (EC2 state reason and console
output, Azure instance view and boot diagnostics, RunPod pod status) before deleting it.
"""

from __future__ import annotations

from typing import Any

from shared.log import redact_text
from shared.models import BootFailure, Outcome, RunRecord, RunState, StepMessage
from shared.queues import get_queues
from shared.runs.steps import Step
from shared.services.agent import refuse_ended
from shared.services.run_events import event
from shared.services.transitions import move
from shared.store import get_store

# StepMessage.reason of a release that should first record the cloud's account of the machine.
BOOT_FAILED = "boot-failed"
CLOUD_SAYS = "the cloud says: "
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
          f"agent had reported; the run is {run.state.value} and goes on by the agent's reports and deadlines")
    return {"state": run.state.value}


def cloud_account(run: RunRecord) -> str:
    """What the cloud says of the run's machine (one describe), or why that could not be read.
    Never raises: a cloud outage must not stop a deadline or a release."""
    from shared.providers.base import console_of
    from shared.runs.resources import merge_resources
    from shared.services.backends import compute_for, ref_of

    try:
        provider = compute_for(run.org, run.provider)
        ref, resources = ref_of(run), merge_resources(get_store().list_ledger(run.id), run.resources)
        desc = provider.describe(ref, resources)
    except Exception as exc:
        return f"the cloud's state of the machine could not be read: {redact_text(str(exc))[:300]}"
    said = redact_text(" ".join(part for part in (desc.reason, desc.detail) if part))[:1000]
    console = console_of(provider, ref, resources)  # bounded and scrubbed of secrets
    said += f"; its console's last lines:\n{console}" if console else ""
    return (CLOUD_SAYS + said) if said.strip("; ") else ""


def note_cloud_account(run: RunRecord) -> RunRecord:
    """Before a never-started machine is deleted: the cloud's account, added to the run's reason once."""
    if CLOUD_SAYS in run.reason:
        return run
    said = cloud_account(run)
    if not said:
        return run

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.releasing or CLOUD_SAYS in r.reason:
            return None
        return r.model_copy(update={"reason": f"{r.reason} ({said})"[:6000]})

    new, _ = get_store().mutate_run(run.org, run.id, change)
    return new
