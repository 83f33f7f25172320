"""The release step: delete the run's machine, disk and NIC, confirm with the cloud, end the run.

It serves a run in releasing, which ends at its outcome once the cloud confirms nothing of
the run is left. An unconfirmed or failed release is retried by a message to itself with
backoff (release_after, release_attempts); if that message is lost, the sweeper re-sends it.
"""

from __future__ import annotations

from datetime import timedelta

from shared.clock import now
from shared.context import Context
from shared.errors import ProviderError, RetryableError
from shared.lifecycle import released_state
from shared.models import RunRecord, RunState, StepMessage
from shared.runs.cloud_report import BOOT_FAILED, note_cloud_report
from shared.runs.events import event
from shared.runs.moves import move
from shared.runs.org_backends import compute_for, ref_of, run_connection
from shared.runs.resources import merge_resources
from shared.runs.scope import refuse_other_scope
from shared.services.steps.working_files import remove_after_release
from shared.steps import Step


def release_delay(ctx: Context, attempts: int) -> float:
    """Capped exponential backoff between release attempts (the sweeper uses it too)."""
    return float(min(ctx.settings.release_backoff_max_s, 15 * 2 ** min(attempts, 10)))


def release(ctx: Context, msg: StepMessage) -> None:
    store = ctx.store
    run, _ = store.runs.get(msg.org, msg.run_id)
    if run.state not in Step.release.serves:
        return
    if msg.reason == BOOT_FAILED and run.release_attempts == 0:
        run = note_cloud_report(ctx, run)  # before the machine, and what the cloud knows of it, is gone
    resources = merge_resources(store.ledger.read(run.id), run.resources)
    asked = 0.0
    try:
        provider = compute_for(ctx, run.org, run_connection(run))
        refuse_other_scope(run, provider)  # a connection moved to another scope would "release" nothing
        out = provider.release(ref_of(ctx, run), resources)
        detail = out.detail
        if out.done:
            remove_after_release(ctx, run, resources)  # the pod's files on a network volume; nothing writes there now
    except ProviderError as exc:
        out, detail = None, exc.reason
        asked = exc.retry_after_s if isinstance(exc, RetryableError) else 0.0  # a throttled cloud's own wait
    if out is not None and out.done:
        for res in resources:
            store.ledger.record(res.model_copy(update={"state": "deleted"}))
        move(ctx, run, released_state(run), expect=Step.release.serves, release_error="", billing_note="", released_at=now())
        return
    attempts = run.release_attempts + 1
    # Never sooner than a throttled cloud asked (Azure's Compute limits ask up to 20 min): an early retry
    # counts against the same limit and prolongs it.
    delay = out.retry_after_s if out is not None and attempts < 4 else max(release_delay(ctx, attempts), asked)

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.releasing:
            return None
        return r.model_copy(update={"release_attempts": attempts, "release_error": detail, "updated_at": now(),
                                    "release_after": now() + timedelta(seconds=delay)})

    run, wrote = store.runs.mutate(run.org, run.id, change)
    if wrote and out is None:
        event(ctx, run, "warning", f"release attempt {attempts} failed: {detail}; retrying in {int(delay)} s")
    ctx.queues.send(Step.release, msg, delay_s=delay)
