"""A machine that never started training: its own failure report, and the cloud's account of it.

Two ways a start fails, both released (never retained: nothing ran, nothing can be recovered):
- the machine reports it (POST /api/agent/runs/{id}/boot-failed from the bootstrap script of
  shared/providers/cloudinit.py): the pull, the container start or the agent failed. Accepted
  only while the run is provisioning, i.e. its agent never reported; afterwards the agent's own
  reports and the heartbeat deadline decide, and the report is kept as an event only.
- it stays silent past the boot deadline (heartbeat-check, settings.provisioning_timeout_s).
The release step then adds what the cloud says of the machine (EC2 state reason and console
output, Azure instance view and boot diagnostics, RunPod pod status) before deleting it
(shared/runs/cloud_report.py).

Before any of this a cloud-init machine (AWS, Azure) exchanges the one-time claim its user data
holds for its environment (exchange_claim): user data is readable through the metadata service for
the machine's whole life, so it carries no secret that outlives that first exchange.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shared import metrics
from shared.clock import now
from shared.errors import Conflict, Unauthorized
from shared.log import redact_text
from shared.models import BootFailure, BootstrapClaim, Outcome, RunRecord, RunState, StepMessage
from shared.providers import bootstrap_env, cloudinit
from shared.queues import get_queues
from shared.runs.cloud_report import BOOT_FAILED
from shared.runs.events import event
from shared.runs.moves import move
from shared.services.api.agent import refuse_ended
from shared.services.steps.launch import bootstrap_for
from shared.settings import get_settings
from shared.steps import Step
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
    run, _ = get_store().runs.get(org, run_id)
    refuse_ended(run)
    if run.state == RunState.provisioning:
        run, wrote = move(run, RunState.releasing, expect={RunState.provisioning}, outcome=Outcome.failed,
                          reason=_reason(body))
        if wrote:
            metrics.count(metrics.FAILED_STARTS, cause=body.stage, provider=run.provider)
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


def exchange_claim(run_id: str, body: BootstrapClaim) -> dict[str, Any]:
    """The machine's environment (the agent's env line: run token, storage access, HF token), once.

    Accepted while the run is provisioning and its claim was never exchanged; the write that marks
    it claimed comes first (ETag-guarded), so two exchanges racing get one answer. A refused
    exchange is recorded on the run: a second one means the user data was read by someone else (or
    the answer to the first was lost; then the machine cannot start and the boot deadline releases
    it). The exchange is the machine's first report: the boot deadline then allows the image pull
    (provisioning_by moves to now + the provisioning timeout)."""
    org = bootstrap_env.claim_org(body.claim, run_id)
    if org is None:
        raise Unauthorized("the bootstrap claim is not valid for this run")
    store = get_store()
    run, _ = store.runs.get(org, run_id)
    refuse_ended(run)
    t = now()

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.provisioning or r.bootstrap_claimed_at is not None:
            return None
        pull_by = t + timedelta(seconds=get_settings().provisioning_timeout_s)
        deadlines = r.deadlines.model_copy(update={"provisioning_by": max(pull_by, r.deadlines.provisioning_by or t)})
        return r.model_copy(update={"bootstrap_claimed_at": t, "deadlines": deadlines, "updated_at": t})

    run, wrote = store.runs.mutate(org, run_id, change)
    if not wrote:
        why = (f"it was exchanged at {run.bootstrap_claimed_at.isoformat()}" if run.bootstrap_claimed_at
               else f"the run is {run.state.value}")
        event(run, "warning", f"a second exchange of the machine's bootstrap claim was refused ({why}): the claim is "
              "good once; if the machine did not get its environment, the boot deadline releases it", source="machine")
        raise Conflict(f"the bootstrap claim was refused: {why}")
    env = {"TENSORANT_DATA_DIR": cloudinit.CONTAINER_DATA_DIR, **bootstrap_for(run).env}
    event(run, "audit", "the machine exchanged its bootstrap claim for its environment")
    return {"bootstrap": bootstrap_env.encode(env), "token": env["TENSORANT_RUN_TOKEN"]}
