"""What the cloud says of a machine that never started training, added to the run's reason before
the release step deletes the machine (and with it what the cloud knows of it).

A release sent with reason BOOT_FAILED (the machine's own boot-failed report, or heartbeat-check's
boot deadline) records it on its first attempt.
"""

from __future__ import annotations

from shared.context import Context
from shared.log import redact_text
from shared.models import RunRecord, RunState
from shared.providers.base import console_of
from shared.runs.org_backends import compute_for, ref_of, run_connection
from shared.runs.resources import merge_resources

# StepMessage.reason of a release that should first record the cloud's account of the machine.
BOOT_FAILED = "boot-failed"
CLOUD_SAYS = "the cloud says: "


def cloud_report(ctx: Context, run: RunRecord) -> str:
    """What the cloud says of the run's machine (one describe), or why that could not be read.
    Never raises: a cloud outage must not stop a deadline or a release."""
    try:
        provider = compute_for(ctx, run.org, run_connection(run))
        ref, resources = ref_of(ctx, run), merge_resources(ctx.store.ledger.read(run.id), run.resources)
        desc = provider.describe(ref, resources)
    except Exception as exc:
        return f"the cloud's state of the machine could not be read: {redact_text(str(exc))[:300]}"
    said = redact_text(" ".join(part for part in (desc.reason, desc.detail) if part))[:1000]
    console = console_of(provider, ref, resources)  # bounded and scrubbed of secrets
    said += f"; its console's last lines:\n{console}" if console else ""
    return (CLOUD_SAYS + said) if said.strip("; ") else ""


def note_cloud_report(ctx: Context, run: RunRecord) -> RunRecord:
    """Before a never-started machine is deleted: the cloud's account, added to the run's reason once."""
    if CLOUD_SAYS in run.reason:
        return run
    said = cloud_report(ctx, run)
    if not said:
        return run

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.releasing or CLOUD_SAYS in r.reason:
            return None
        return r.model_copy(update={"reason": f"{r.reason} ({said})"[:6000]})

    new, _ = ctx.store.runs.mutate(run.org, run.id, change)
    return new
