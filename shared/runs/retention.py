"""What a retained machine is kept for, and for how long.

A run is retained (machine stopped, disk kept, billed as disk) so that its output can be recovered.
Two things bound that bill:
- a run whose machine holds nothing recoverable is not kept at all: one that missed a deadline before
  it ever reported training (the agent reported once, then died while preparing) has no checkpoint and
  no output, unless a checkpoint of it reached storage anyway (an agent that trained on without
  reaching the control plane uploads its checkpoints to storage directly). heartbeat-check marks such a
  run (`release_if_nothing_saved`) in its move to retaining; the retain step asks storage and releases
  it, failed, when nothing is there;
- a retained run has the org's retention limit (OrgLimits.retention_limit_s, 14 days by default),
  counted from when it was last retained: heartbeat-check warns the owner with an event
  WARN_BEFORE_S before it, then discards the run at it (released as a discard is, ended failed).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from shared.models import RunRecord, RunState
from shared.org_storage.base import ObjectMissing, adapter_key
from shared.runs.org_backends import storage_for
from shared.runs.org_limits import DAY_S, OrgLimits

# The owner is warned this long before the discard (half-way for a limit shorter than twice this).
WARN_BEFORE_S = 2 * DAY_S
# Before training the agent uploads nothing: its checkpoints' adapters are uploaded as they are made.
UNTRAINED = frozenset({RunState.provisioning, RunState.preparing})


def never_trained(run: RunRecord) -> bool:
    """What the control plane knows without asking: the run never reached training (phases only move
    forward, and a resumed run goes back to training, not before it) and no output was reported."""
    return run.state in UNTRAINED and not run.adapter_sha256


def checkpoint_saved(run: RunRecord) -> bool:
    """Whether an adapter of the run is in storage: the agent uploads each checkpoint's adapter to the run's
    adapter key as it is made, and the final adapter replaces it."""
    try:
        storage_for(run.org).open_stream(adapter_key(run.id), 1).close()
    except ObjectMissing:
        return False
    except ValueError:  # larger than the one byte asked for: it is there
        return True
    return True


@dataclass(frozen=True)
class RetentionAction:
    kind: Literal["warn", "discard"]
    message: str


def discard_at(run: RunRecord, limits: OrgLimits) -> datetime:
    """When a retained run is discarded under `limits`: its retention limit after it was last retained."""
    return run.state_changed_at + timedelta(seconds=limits.retention_limit_s)


def warn_at(run: RunRecord, limits: OrgLimits) -> datetime:
    ahead = min(WARN_BEFORE_S, limits.retention_limit_s // 2)
    return discard_at(run, limits) - timedelta(seconds=ahead)


def _days(seconds: float) -> str:
    days = seconds / DAY_S
    return f"{days:g} day" + ("" if days == 1 else "s") if days >= 1 else f"{round(seconds / 3600)} h"


def retention_action(run: RunRecord, limits: OrgLimits, now: datetime) -> RetentionAction | None:
    """What heartbeat-check does to a retained run at `now`: discard it (past the retention limit), warn its
    owner once (past the warning point), or nothing."""
    if run.state != RunState.retained:
        return None
    end = discard_at(run, limits)
    limit = _days(limits.retention_limit_s)
    if now >= end:
        return RetentionAction("discard", (
            f"discarded: retained for the organization's retention limit of {limit} (retention_limit_s) without "
            f"a recovery; the machine and disk are released, with any output on them. Before: {run.reason}"))
    warned = run.retention_warned_at is not None and run.retention_warned_at >= run.state_changed_at
    if now >= warn_at(run, limits) and not warned:
        return RetentionAction("warn", (
            f"retained since {run.state_changed_at:%Y-%m-%d %H:%M} UTC: the run will be discarded at "
            f"{end:%Y-%m-%d %H:%M} UTC (the organization's retention limit of {limit}), releasing the machine and "
            "disk with any output on them; recover it before then (verify_saved, an upload or resume), or an owner "
            "raises retention_limit_s under /api/org/limits"))
    return None


def retention_note(run: RunRecord, limits: OrgLimits) -> str:
    """The run view's line for a retained run: until when it is kept."""
    return (f"kept until {discard_at(run, limits):%Y-%m-%d %H:%M} UTC (the organization's retention limit of "
            f"{_days(limits.retention_limit_s)}); then it is discarded: the machine and disk are released with any "
            "output on them")
