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

A retained machine started again (recover start_machine or resume) was stopped for hours or days: its
agent's token (settings.agent_token_ttl_s) and presigned URLs may have expired meanwhile. The agent then
exchanges its expired token, once per start, for a fresh one (exchange_restart), with the same discipline
as the claim.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shared import metrics
from shared.clock import now
from shared.context import Context
from shared.errors import Conflict, Unauthorized
from shared.key_rotation import current_key_since
from shared.lifecycle import ACTIVE
from shared.log import redact_text
from shared.models import BootFailure, BootstrapClaim, Outcome, RunRecord, RunState, StepMessage
from shared.providers import bootstrap_env, cloudinit
from shared.runs.cloud_report import BOOT_FAILED
from shared.runs.events import event
from shared.runs.moves import move
from shared.security import mint_agent_token, verify_agent
from shared.services.api.agent import refuse_ended
from shared.services.steps.launch import EXPORT_MARGIN_S, bootstrap_for, storage_access
from shared.steps import Step

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


def boot_failed(ctx: Context, org: str, run_id: str, body: BootFailure) -> dict[str, Any]:
    run, _ = ctx.store.runs.get(org, run_id)
    refuse_ended(run)
    if run.state == RunState.provisioning:
        run, wrote = move(ctx, run, RunState.releasing, expect={RunState.provisioning}, outcome=Outcome.failed,
                          reason=_reason(body))
        if wrote:
            metrics.count(metrics.FAILED_STARTS, cause=body.stage, provider=run.provider)
            ctx.queues.send(Step.release, StepMessage(org=org, run_id=run_id, reason=BOOT_FAILED))
            return {"state": run.state.value}
    if run.state == RunState.releasing and run.outcome == Outcome.failed and run.reason.startswith(_STAGES[body.stage]):
        # The same report again (the script retries when an answer is lost): the message may have been lost too.
        ctx.queues.send(Step.release, StepMessage(org=org, run_id=run_id, reason=BOOT_FAILED))
        return {"state": run.state.value}
    event(ctx, run, "warning", f"the machine reported that {_STAGES[body.stage]} (exit code {body.exit_code}) after the "
          f"agent had reported; the run is {run.state.value} and goes on by the agent's reports and deadlines",
          source="machine")
    return {"state": run.state.value}


def exchange_claim(ctx: Context, run_id: str, body: BootstrapClaim) -> dict[str, Any]:
    """The machine's environment (the agent's env line: run token, storage access, HF token), once.

    Accepted while the run is provisioning and its claim was never exchanged; the write that marks
    it claimed comes first (ETag-guarded), so two exchanges racing get one answer. A refused
    exchange is recorded on the run: a second one means the user data was read by someone else (or
    the answer to the first was lost; then the machine cannot start and the boot deadline releases
    it). The exchange is the machine's first report: the boot deadline then allows the image pull
    (provisioning_by moves to now + the provisioning timeout)."""
    found = bootstrap_env.claim_org(body.claim, run_id)
    if found is None:
        raise Unauthorized("the bootstrap claim is not valid for this run")
    org, previous_key = found
    store = ctx.store
    run, _ = store.runs.get(org, run_id)
    refuse_ended(run)
    t = now()
    # launched_at is kept to the microsecond and the key's first sighting as a float: a launch at the very instant
    # the key was first seen must read as after it (a millisecond's margin), never as before.
    if previous_key and (run.launched_at is None or run.launched_at.timestamp() + 1e-3 >= current_key_since(ctx)):
        # A launch after the rotation signs with the new key: this claim was forged with the rotated-out one.
        raise Unauthorized("the bootstrap claim is signed with a key that was rotated out and its run was launched "
                           "after the rotation")
    if run.deadlines.provisioning_by is not None and t > run.deadlines.provisioning_by:
        raise Unauthorized("the bootstrap claim has expired: the run's boot deadline passed "
                           f"({run.deadlines.provisioning_by.isoformat()})")

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.provisioning or r.bootstrap_claimed_at is not None:
            return None
        pull_by = t + timedelta(seconds=ctx.settings.provisioning_timeout_s)
        deadlines = r.deadlines.model_copy(update={"provisioning_by": max(pull_by, r.deadlines.provisioning_by or t)})
        return r.model_copy(update={"bootstrap_claimed_at": t, "deadlines": deadlines, "updated_at": t})

    run, wrote = store.runs.mutate(org, run_id, change)
    if not wrote:
        why = (f"it was exchanged at {run.bootstrap_claimed_at.isoformat()}" if run.bootstrap_claimed_at
               else f"the run is {run.state.value}")
        event(ctx, run, "warning", f"a second exchange of the machine's bootstrap claim was refused ({why}): the claim is "
              "good once; if the machine did not get its environment, the boot deadline releases it", source="machine")
        raise Conflict(f"the bootstrap claim was refused: {why}")
    env = {"TENSORANT_DATA_DIR": cloudinit.CONTAINER_DATA_DIR, **bootstrap_for(ctx, run).env}
    event(ctx, run, "audit", "the machine exchanged its bootstrap claim for its environment")
    return {"bootstrap": bootstrap_env.encode(env), "token": env["TENSORANT_RUN_TOKEN"]}


def _restart_open(r: RunRecord, issued_at: float) -> str:
    """Why this run's restart cannot be exchanged for a token issued at `issued_at`; "" when it can."""
    asked = r.restart_requested_at
    if asked is None:
        return "the control plane never started this run's machine again"
    if r.restart_exchanged_at is not None and r.restart_exchanged_at >= asked:
        return f"this start's exchange was made at {r.restart_exchanged_at.isoformat()}"
    if issued_at >= int(asked.timestamp()):  # iat is whole seconds: one of the start's second counts as after it
        return "the token was issued after the machine was started again; heartbeats renew it"
    if r.state not in ACTIVE and r.state != RunState.retained:
        return f"the run is {r.state.value}: its agent is not waiting to go on"
    return ""


def exchange_restart(ctx: Context, header: str | None, run_id: str) -> dict[str, Any]:
    """A fresh token (and storage access) for an agent whose retained machine was started again, once per start.

    The token sent may have expired; nothing else is relaxed (signature, audience, issuer, org and run are
    verified as for any agent call). Accepted only when the control plane started the machine after that
    token was issued (restart_requested_at, recorded by recover start_machine or resume before its cloud call:
    the local provider's machine answers within a second of its start), the run is retained or back in an
    agent phase, and that start was not exchanged yet; the write that marks it
    exchanged comes first (ETag-guarded), so two exchanges racing get one answer. A refusal is recorded on
    the run when it has a start to exchange: a second exchange means an old token was used by someone else
    (or the first answer was lost; then the deadlines retain the run again, and a new resume opens a new
    exchange)."""
    token = verify_agent(ctx, header, run_id, allow_expired=True)
    store = ctx.store
    run, _ = store.runs.get(token.org, run_id)
    refuse_ended(run)
    why = _restart_open(run, token.issued_at)
    t = now()

    def change(r: RunRecord) -> RunRecord | None:
        return None if _restart_open(r, token.issued_at) else r.model_copy(update={"restart_exchanged_at": t})

    if not why:
        run, wrote = store.runs.mutate(token.org, run_id, change)
        why = "" if wrote else (_restart_open(run, token.issued_at) or "the run changed at the same time")
    if why:
        if run.restart_requested_at is not None:
            event(ctx, run, "warning", f"an exchange of an agent token for the restart of the machine was refused "
                  f"({why}): each start of a retained machine is exchanged once", source="machine")
        raise Conflict(f"the restart exchange was refused: {why}")
    ttl = ctx.settings.agent_token_ttl_s
    fresh = mint_agent_token(token.org, run_id, ttl_s=ttl)
    event(ctx, run, "audit", "the agent of the machine started again exchanged its expired token for a fresh one")
    return {"token": fresh, "token_expires_at": (t + timedelta(seconds=ttl)).isoformat(),
            "bootstrap": bootstrap_env.encode(_continue_env(ctx, run))}


def _continue_env(ctx: Context, run: RunRecord) -> dict[str, str]:
    """What the agent continues with: storage access valid for the runtime limit and the export from now (what
    it was handed at launch may have expired while the machine was stopped)."""
    dataset = ctx.store.datasets.get(run.org, run.dataset_version_id)
    env, _ = storage_access(ctx, run, dataset, run.runtime_limit_s + EXPORT_MARGIN_S)
    return env
