"""A run's kept checkpoint adapters: listed, downloaded one by one, and copied to the run's adapter key for a
recovery that ends the run with one of them.

The agent keeps the newest training.keep_checkpoints checkpoints' adapters in a ring of storage slots
(shared.org_storage.base.checkpoint_key) and reports which step is in which slot with its heartbeats. A slot
being overwritten by a newer checkpoint may not have been reported yet, so every use checks the archive's
sha256 against the reported one (a download URL comes with the sha256 for the client to check)."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from shared.clock import now
from shared.context import Context
from shared.errors import Conflict, InvalidInput, NotFound
from shared.models import CheckpointInfo, Role, RunRecord
from shared.org_storage.base import ObjectMissing, checkpoint_key
from shared.runs.events import event
from shared.runs.org_backends import storage_for
from shared.security import Principal, require
from shared.services.api.runs.adapter import ADAPTER_URL_TTL_S, MAX_UPLOAD, AdapterStream


def checkpoints(ctx: Context, principal: Principal, run_id: str) -> dict[str, Any]:
    """The run's kept checkpoints, oldest step first (the slot is storage's business, not the caller's)."""
    require(principal, Role.owner, Role.member)
    run, _ = ctx.store.runs.get(principal.org, run_id)
    return {"run_id": run.id, "keep_checkpoints": run.training.keep_checkpoints,
            "checkpoints": [c.model_dump(mode="json", exclude={"slot"}) for c in run.checkpoints]}


def named(run: RunRecord, step: int) -> CheckpointInfo:
    for c in run.checkpoints:
        if c.step == step:
            return c
    kept = ", ".join(str(c.step) for c in run.checkpoints) or "none"
    raise NotFound(f"checkpoint {step} is not kept for this run (kept steps: {kept}); list them with "
                   f"GET /api/runs/{run.id}/checkpoints")


def read_checkpoint(ctx: Context, run: RunRecord, c: CheckpointInfo) -> bytes:
    """The checkpoint's archive, refused unless it is the one the agent reported for that step."""
    try:
        data = storage_for(ctx, run.org).get(checkpoint_key(run.id, c.slot), MAX_UPLOAD)
    except ObjectMissing as exc:
        raise Conflict(f"checkpoint {c.step}'s adapter is no longer in the organization's storage") from exc
    sha = hashlib.sha256(data).hexdigest()
    if sha != c.sha256:
        raise Conflict(f"checkpoint {c.step}'s slot now holds another archive (sha256 {sha[:12]}..., reported "
                       f"{c.sha256[:12]}...): a newer checkpoint replaced it; list the checkpoints again")
    return data


def download(ctx: Context, principal: Principal, run_id: str, step_text: str) -> AdapterStream | dict[str, Any]:
    """One kept checkpoint's adapter archive, in any state of the run: its bytes (local storage) or a
    short-lived URL with the sha256 the archive must have."""
    require(principal, Role.owner, Role.member)
    if not step_text.isdigit() or len(step_text) > 8 or int(step_text) < 1:
        raise InvalidInput.field("checkpoint", f"is {step_text[:20]!r}; use a step number from "
                                 f"GET /api/runs/{run_id}/checkpoints")
    run, _ = ctx.store.runs.get(principal.org, run_id)
    c = named(run, int(step_text))
    url = storage_for(ctx, run.org).download_url(checkpoint_key(run.id, c.slot), ADAPTER_URL_TTL_S)
    if url is not None:
        event(ctx, run, "audit", f"checkpoint {c.step} download link issued to {principal.sub} "
              f"(valid {ADAPTER_URL_TTL_S // 60} min)")
        return {"url": url, "expires_at": now() + timedelta(seconds=ADAPTER_URL_TTL_S), "sha256": c.sha256,
                "size": c.size, "checkpoint_step": c.step}
    data = read_checkpoint(ctx, run, c)
    return AdapterStream(data=data, sha256=c.sha256, filename=f"{run.id}-checkpoint-{c.step}.zip")
