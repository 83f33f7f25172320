"""The adapter of a run: downloaded once the run has succeeded, and read for use only while its
sha256 is the one recorded for the run."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shared.clock import now
from shared.errors import Conflict
from shared.models import Role, RunRecord, RunState
from shared.runs.backends import storage_for
from shared.runs.events import event
from shared.security import Principal, require
from shared.storage.base import ObjectMissing, adapter_key
from shared.store import get_store

MAX_UPLOAD = 1024 * 1024 * 1024


ADAPTER_URL_TTL_S = 15 * 60  # long enough to start a download, short enough that a leaked link dies soon


@dataclass(frozen=True)
class AdapterStream:
    """The adapter archive itself (local storage has no URLs), checked against the verified sha256."""

    data: bytes
    sha256: str
    filename: str


def adapter(principal: Principal, run_id: str) -> AdapterStream | dict[str, Any]:
    """The verified adapter of a succeeded run: its bytes (local storage) or a short-lived URL."""
    require(principal, Role.owner, Role.member)
    run, _ = get_store().get_run(principal.org, run_id)
    if run.state != RunState.succeeded or not run.adapter_sha256:
        raise Conflict(f"the adapter is not available: the run is {run.state.value}; it can be downloaded once "
                       "the run has succeeded with a verified adapter")
    storage = storage_for(run.org)
    key = adapter_key(run.id)
    url = storage.download_url(key, ADAPTER_URL_TTL_S)
    if url is not None:
        event(run, "audit", f"adapter download link issued to {principal.sub} (valid {ADAPTER_URL_TTL_S // 60} min)")
        return {"url": url, "expires_at": now() + timedelta(seconds=ADAPTER_URL_TTL_S),
                "sha256": run.adapter_sha256, "size": run.adapter_size}
    try:
        data = storage.get(key, MAX_UPLOAD)
    except ObjectMissing as exc:
        raise Conflict("the verified adapter is no longer in the organization's storage (deleted outside the "
                       "control plane?)") from exc
    sha = hashlib.sha256(data).hexdigest()
    if sha != run.adapter_sha256:
        # Never hand out bytes that are not the ones the verifier accepted.
        raise Conflict(f"the stored adapter has changed since it was verified (sha256 {sha[:12]}..., verified "
                       f"{run.adapter_sha256[:12]}...); it is not served")
    return AdapterStream(data=data, sha256=sha, filename=f"{run.id}-adapter.zip")


def adapter_for_use(run: RunRecord, max_bytes: int = MAX_UPLOAD) -> bytes:
    """The run's adapter archive as stored, refused unless its sha256 is the one recorded at
    completion (the agent's report) or recovery. The agent's presigned upload URL outlives the
    run, so an archive written after verification must never be served or verified as the run's."""
    if not run.adapter_sha256:
        raise Conflict("the run has no recorded adapter sha256; verify or recover it first")
    data = storage_for(run.org).get(adapter_key(run.id), max_bytes)
    actual = hashlib.sha256(data).hexdigest()
    if actual != run.adapter_sha256:
        event(run, "warning", "the stored adapter archive changed after it was recorded", expected=run.adapter_sha256,
              actual=actual)
        raise Conflict(f"the stored adapter archive (sha256 {actual}) is not the one recorded for this run "
                       f"(sha256 {run.adapter_sha256}): it was replaced after the run reported it, and is refused")
    return data
