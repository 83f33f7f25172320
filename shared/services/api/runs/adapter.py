"""The adapter of a run: downloaded once the run has succeeded, and served only while its sha256 is the
one recorded for the run (a replaced archive is refused, with a warning in the run's history).
`format=merged`: the adapter merged into its base model's weights (training.merged), verified like the
adapter (adapter_format.merged), served the same way."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from adapter_format.base_models import MAX_MERGED_BYTES
from shared.clock import now
from shared.context import Context
from shared.errors import Conflict, InvalidInput, NotFound
from shared.models import Role, RunRecord, RunState
from shared.org_storage.base import ObjectMissing, adapter_key, merged_key
from shared.runs.events import event
from shared.runs.org_backends import storage_for
from shared.security import Principal, require

MAX_UPLOAD = 1024 * 1024 * 1024


ADAPTER_URL_TTL_S = 15 * 60  # long enough to start a download, short enough that a leaked link dies soon


@dataclass(frozen=True)
class AdapterStream:
    """The adapter archive itself (local storage has no URLs), checked against the verified sha256."""

    data: bytes
    sha256: str
    filename: str


FORMATS = ("adapter", "merged")


def adapter(ctx: Context, principal: Principal, run_id: str, fmt: str | None = None) -> AdapterStream | dict[str, Any]:
    """The verified adapter (or, fmt "merged", merged model) of a succeeded run: its bytes (local storage)
    or a short-lived URL."""
    require(principal, Role.owner, Role.member)
    if fmt not in (None, "", *FORMATS):
        raise InvalidInput.field("format", f"is {fmt!r}; use adapter (the default) or merged")
    run, _ = ctx.store.runs.get(principal.org, run_id)
    if run.state != RunState.succeeded or not run.adapter_sha256:
        raise Conflict(f"the adapter is not available: the run is {run.state.value}; it can be downloaded once "
                       "the run has succeeded with a verified adapter")
    if fmt == "merged":
        if not run.merged_sha256:
            raise NotFound("this run has no merged model: " + (
                run.merged_note or "it was not asked for (set training.merged: true on a new run)"))
        return _serve(ctx, principal, run, merged_key(run.id), "merged model", (run.merged_sha256, run.merged_size))
    return _serve(ctx, principal, run, adapter_key(run.id), "adapter", (run.adapter_sha256, run.adapter_size))


def _serve(ctx: Context, principal: Principal, run: RunRecord, key: str, what: str,
           verified: tuple[str, int]) -> AdapterStream | dict[str, Any]:
    storage = storage_for(ctx, run.org)
    url = storage.download_url(key, ADAPTER_URL_TTL_S)
    if url is not None:
        event(ctx, run, "audit", f"{what} download link issued to {principal.sub} (valid {ADAPTER_URL_TTL_S // 60} min)")
        return {"url": url, "expires_at": now() + timedelta(seconds=ADAPTER_URL_TTL_S),
                "sha256": verified[0], "size": verified[1]}
    try:
        data = storage.get(key, MAX_MERGED_BYTES if what != "adapter" else MAX_UPLOAD)
    except ObjectMissing as exc:
        raise Conflict(f"the verified {what} is no longer in the organization's storage (deleted outside the "
                       "control plane?)") from exc
    sha = hashlib.sha256(data).hexdigest()
    if sha != verified[0]:
        # Never hand out bytes that are not the ones the verifier accepted. The agent's presigned upload URL
        # outlives the run, so a late PUT can replace the object: the run's history says so.
        event(ctx, run, "warning", f"the stored {what} changed after it was verified", source="download", expected=verified[0],
              actual=sha)
        raise Conflict(f"the stored {what} has changed since it was verified (sha256 {sha[:12]}..., verified "
                       f"{verified[0][:12]}...); it is not served")
    return AdapterStream(data=data, sha256=sha, filename=f"{run.id}-{what.split()[0]}.zip")
