"""The retain step: stop the run's machine and keep its disk, so the run can be recovered.

It serves a run in retaining. A machine that is already gone leaves nothing to keep: the
run fails through releasing. So does one that heartbeat-check retained before it ever trained
(`release_if_nothing_saved`) when no checkpoint of it is in storage (shared/runs/retention.py).
"Not stopped yet" (the provider waits no longer than the invocation's budget, shared/budget.py)
and a throttled or unavailable cloud are a message to itself with a delay.
"""

from __future__ import annotations

from shared.context import Context
from shared.errors import ProviderError, RetryableError
from shared.log import redact_text
from shared.models import MachineState, Outcome, RunRecord, RunState, StepMessage
from shared.runs.events import event
from shared.runs.moves import move
from shared.runs.org_backends import compute_for, ref_of, run_connection
from shared.runs.resources import merge_resources
from shared.runs.retention import checkpoint_saved
from shared.runs.scope import refuse_other_scope
from shared.steps import Step


def retain(ctx: Context, msg: StepMessage) -> None:
    run, _ = ctx.store.runs.get(msg.org, msg.run_id)
    if run.state not in Step.retain.serves:
        return
    provider = compute_for(ctx, run.org, run_connection(run))
    try:
        refuse_other_scope(run, provider)  # in another scope the machine reads as gone: never judge it there
    except ProviderError as exc:
        # Not stopped: heartbeat-check re-sends retain until the connection points back at the machine.
        event(ctx, run, "warning", f"the machine was not stopped and may still be billing: {exc.reason}")
        return
    ref = ref_of(ctx, run)
    resources = merge_resources(ctx.store.ledger.read(run.id), run.resources)
    # Asked even with nothing recorded: a launch that crashed between the cloud call and the
    # record leaves a machine only its marks can find (every provider describes by the ref).
    desc = provider.describe(ref, resources)
    resources = merge_resources(resources, list(desc.resources))
    if desc.state == MachineState.gone:
        # Vanished outside the control plane (or never created): nothing to stop, nothing to keep.
        reason = ("the machine is gone (deleted outside the control plane or never created); "
                  "nothing to retain or release. " + run.reason)
        run, _ = move(ctx, run, RunState.releasing, expect=Step.retain.serves, reason=reason, outcome=Outcome.failed)
        ctx.queues.send(Step.release, StepMessage(org=run.org, run_id=run.id))
        return
    if run.release_if_nothing_saved and not _saved(ctx, run):
        # heartbeat-check retained it before it ever trained, and no checkpoint reached storage: the disk
        # holds nothing to recover, so keeping it would only bill.
        reason = run.reason + "; no checkpoint or output of it was saved: the machine is released with its disk"
        run, _ = move(ctx, run, RunState.releasing, expect=Step.retain.serves, reason=reason, outcome=Outcome.failed)
        ctx.queues.send(Step.release, StepMessage(org=run.org, run_id=run.id))
        return
    try:
        out = provider.retain(ref, resources)
    except RetryableError as exc:
        event(ctx, run, "warning", f"stopping the machine will be retried in {int(exc.retry_after_s)} s: {exc.reason}")
        ctx.queues.send(Step.retain, msg, delay_s=exc.retry_after_s)
        return
    except ProviderError as exc:
        event(ctx, run, "warning", f"stopping the machine failed: {exc.reason}; it may still be billing")
        raise
    if not out.done:
        ctx.queues.send(Step.retain, msg, delay_s=out.retry_after_s)
        return
    move(ctx, run, RunState.retained, expect=Step.retain.serves, billing_note=out.billing_note,
         release_if_nothing_saved=False, adapter_saved=_saved(ctx, run))


def _saved(ctx: Context, run: RunRecord) -> bool:
    """Whether a checkpoint of the run is in storage; an unanswered question counts as yes (keep the disk)."""
    try:
        return checkpoint_saved(ctx, run)
    except Exception as exc:  # any failure to answer: keeping is the safe side, a release cannot be undone
        event(ctx, run, "warning", f"storage could not say whether a checkpoint was saved ({redact_text(str(exc))}); "
                              "the disk is kept")
        return True
