"""A RunPod pod's working files on the org's network volume, removed once its run is over.

With a network volume, a pod's data directory is on the volume (storage.base.scratch_key:
data/<RUN_ID>/, the pod's /workspace/data/<RUN_ID>): the dataset copy, output/, adapter.zip,
logs.txt and agent-state.json (which holds a run token). The volume outlives the pod, so these
files would stay, and bill, after every run. The release step calls remove_after_release once the
cloud confirms the pod is gone:
- succeeded: removed. The verified adapter that GET /api/runs/{id}/adapter serves is
  runs/<RUN_ID>/adapter.zip (storage.base.adapter_key), another folder: it stays.
- cancelled: removed (a cancel of a run that may hold output needs discard=true).
- failed: kept. A run fails without output, except when its pod vanished outside the control
  plane while retained: then these files may be the adapter's only copy.
While a run is retained nothing is removed: the files are what recovery reads.

Idempotent and crash-safe: removing what is not there is done, so a redelivered release message
just removes nothing.
"""

from __future__ import annotations

from shared.context import Context
from shared.errors import PermanentError, RetryableError
from shared.models import CloudResource, Outcome, RunRecord
from shared.org_storage.base import scratch_key
from shared.providers.registry import info_of
from shared.runs.events import event
from shared.runs.org_backends import storage_config, storage_for

REMOVED_AFTER = {Outcome.succeeded, Outcome.cancelled}


def on_network_volume(resources: list[CloudResource]) -> bool:
    """Whether the run's pod was launched with the org's network volume (its data directory is there)."""
    def on_storage(provider: str) -> bool:
        info = info_of(provider)
        return info is not None and info.working_files_on_storage

    return any(on_storage(r.provider) and r.extra.get("networkVolumeId") for r in resources)


def remove_after_release(ctx: Context, run: RunRecord, resources: list[CloudResource]) -> None:
    """Remove the run's pod working files from the network volume (see the module docstring).

    Raises RetryableError when the volume cannot be reached now (the release step tries again); a
    permanent refusal (a revoked S3 key) becomes a warning on the run, which then ends normally.
    """
    if run.outcome not in REMOVED_AFTER or not on_network_volume(resources):
        return

    folder = scratch_key(run.id) + "/"
    if storage_config(ctx, run.org) is None:
        event(ctx, run, "warning", f"the pod's working files on the network volume ({folder}) were not removed: no "
                              "storage connection is saved; delete them in RunPod if you no longer need them")
        return
    try:
        count = storage_for(ctx, run.org).delete_prefix(folder)
    except RetryableError as exc:
        raise RetryableError(f"the pod is gone; removing its working files ({folder}) from the network volume "
                             f"failed: {exc.reason}", code=exc.code) from exc
    except PermanentError as exc:
        event(ctx, run, "warning", f"the pod's working files on the network volume ({folder}) could not be removed: "
                              f"{exc.reason}; delete them in RunPod if you no longer need them")
        return
    if count:
        event(ctx, run, "audit", f"removed the pod's working files from the network volume ({folder}: {count} files); "
                            "the verified adapter stays available for download", files=count)
