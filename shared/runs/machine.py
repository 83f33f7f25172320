"""Stopping a retained run's machine again (provider.retain once more): a machine started for recovery
bills for its GPU until then. Used by the stop action and heartbeat-check's idle stop."""

from __future__ import annotations

from typing import Any

from shared.clock import now
from shared.context import Context
from shared.models import RunRecord, RunState
from shared.runs import billing
from shared.runs.events import event
from shared.runs.org_backends import compute_for, ref_of, run_connection
from shared.runs.resources import merge_resources


def stop_machine(ctx: Context, run: RunRecord, *, why: str) -> RunRecord:
    """provider.retain on a retained run's machine; clears machine_started_at once the cloud confirms.
    Raises ProviderError. Used by stop() and heartbeat-check's idle stop."""
    resources = merge_resources(ctx.store.ledger.read(run.id), run.resources)
    out = compute_for(ctx, run.org, run_connection(run)).retain(ref_of(ctx, run), resources)
    if out.done:
        note = out.billing_note or "the machine is stopped; its disk still bills"
        update: dict[str, Any] = {"billing_note": note, "machine_started_at": None}
    else:
        # Left started: a repeated stop (or the idle stop) asks the cloud again.
        note = f"the machine is stopping; the cloud has not confirmed it yet ({out.detail or 'no detail'})"
        update = {"billing_note": note}
    # machine="stopped" marks the stop on the timeline (usage.timing of a record without billing).
    event(ctx, run, "audit", f"{why}: {note}", detail=out.detail, **({"machine": "stopped"} if out.done else {}))

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in (RunState.retained, RunState.recovering):
            return None
        if out.done:
            r = billing.switched(r, False, now())
        return r.model_copy(update={**update, "updated_at": now()})

    return ctx.store.runs.mutate(run.org, run.id, change)[0]
