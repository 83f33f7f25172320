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

No clock deletes what could be recovered: the discard also waits until the warning's interval has passed
on the clock that counted it, the control plane's current serving period (heartbeat_check.serving_since).
A clock that jumps (either way), an instance whose clock disagrees, or an outage starts a new period, and
with it the countdown again (silently: the owner's event was recorded once). So a discard always comes a
full warning interval of one steady clock after its event, however far a clock moves, and a lowered
retention limit (PUT /api/org/limits) warns the runs it affects before it discards any.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from shared.context import Context
from shared.models import RunRecord, RunState
from shared.org_storage.base import ObjectMissing, adapter_key
from shared.runs.org_backends import storage_for
from shared.runs.org_limits import DAY_S, OrgLimits, RetentionAffected

# The owner is warned this long before the discard (half-way for a limit shorter than twice this).
WARN_BEFORE_S = 2 * DAY_S
# Before training the agent uploads nothing: its checkpoints' adapters are uploaded as they are made.
UNTRAINED = frozenset({RunState.provisioning, RunState.preparing})


def never_trained(run: RunRecord) -> bool:
    """What the control plane knows without asking: the run never reached training (phases only move
    forward, and a resumed run goes back to training, not before it) and no output was reported."""
    return run.state in UNTRAINED and not run.adapter_sha256


def checkpoint_saved(ctx: Context, run: RunRecord) -> bool:
    """Whether an adapter of the run is in storage: the agent uploads each checkpoint's adapter to the run's
    adapter key as it is made, and the final adapter replaces it."""
    try:
        storage_for(ctx, run.org).open_stream(adapter_key(run.id), 1).close()
    except ObjectMissing:
        return False
    except ValueError:  # larger than the one byte asked for: it is there
        return True
    return True


@dataclass(frozen=True)
class RetentionAction:
    # warn: record the owner's event and start the countdown; countdown: start it again on this period's
    # clock (the event was recorded already); discard: the limit and a full countdown have passed.
    kind: Literal["warn", "countdown", "discard"]
    message: str


def discard_at(run: RunRecord, limits: OrgLimits) -> datetime:
    """When a retained run is discarded under `limits`: its retention limit after it was last retained (at
    the earliest: also a full warning interval after its warning, see retention_action)."""
    return run.state_changed_at + timedelta(seconds=limits.retention_limit_s)


def warn_ahead_s(limits: OrgLimits) -> int:
    """The warning's interval: how long before the discard the owner is warned, at least."""
    return min(WARN_BEFORE_S, limits.retention_limit_s // 2)


def warn_at(run: RunRecord, limits: OrgLimits) -> datetime:
    return discard_at(run, limits) - timedelta(seconds=warn_ahead_s(limits))


def _days(seconds: float) -> str:
    days = seconds / DAY_S
    return f"{days:g} day" + ("" if days == 1 else "s") if days >= 1 else f"{round(seconds / 3600)} h"


def warned(run: RunRecord) -> bool:
    """Whether the owner's warning event was recorded in this stay in retained."""
    return run.retention_countdown is not None and run.retention_countdown.stay == run.state_changed_at


def retention_action(run: RunRecord, limits: OrgLimits, now: datetime,
                     period: datetime | None = None) -> RetentionAction | None:
    """What heartbeat-check does to a retained run at `now`, `period` being when the control plane's current
    serving period began (its clock's identity; None: `now` itself, a period of one tick). Warn is checked
    before discard: a run is discarded only past its limit and a full warning interval after the countdown
    its warning started, both on this period's clock."""
    if run.state != RunState.retained or now < warn_at(run, limits):
        return None
    period = period or now
    end = discard_at(run, limits)
    limit = _days(limits.retention_limit_s)
    ahead = warn_ahead_s(limits)
    if not warned(run):
        end = max(end, now + timedelta(seconds=ahead))
        return RetentionAction("warn", (
            f"retained since {run.state_changed_at:%Y-%m-%d %H:%M} UTC: the run will be discarded at "
            f"{end:%Y-%m-%d %H:%M} UTC at the earliest (the organization's retention limit of {limit}), releasing "
            "the machine and disk with any output on them; recover it before then (verify_saved, an upload or "
            "resume), or an owner raises retention_limit_s under /api/org/limits"))
    countdown = run.retention_countdown
    assert countdown is not None  # warned
    started = countdown.started
    if countdown.period != period or started > now:
        return RetentionAction("countdown", "the clock that counts the warning's interval changed: counted again")
    if now >= end and (now - started).total_seconds() >= ahead:
        return RetentionAction("discard", (
            f"discarded: retained for the organization's retention limit of {limit} (retention_limit_s) without "
            f"a recovery, warned {_days(ahead)} before; the machine and disk are released, with any output on them. "
            f"Before: {run.reason}"))
    return None


def retention_note(run: RunRecord, limits: OrgLimits) -> str:
    """The run view's line for a retained run: until when it is kept."""
    return (f"kept until {discard_at(run, limits):%Y-%m-%d %H:%M} UTC (the organization's retention limit of "
            f"{_days(limits.retention_limit_s)}); then it is discarded: the machine and disk are released with any "
            "output on them")


def affected_by(runs: list[RunRecord], old: OrgLimits, new: OrgLimits, now: datetime) -> list[RetentionAffected]:
    """The retained runs of `runs` whose discard a change from `old` to `new` brings forward, with the earliest
    discard under `new`. Nothing is discarded here: heartbeat-check warns each first (retention_action)."""
    if new.retention_limit_s >= old.retention_limit_s:
        return []
    ahead = timedelta(seconds=warn_ahead_s(new))
    out = []
    for run in runs:
        if run.state != RunState.retained:
            continue
        countdown = run.retention_countdown
        started = countdown.started if countdown is not None and warned(run) else now
        earliest = max(discard_at(run, new), started + ahead)
        if earliest < discard_at(run, old):
            out.append(RetentionAffected(run_id=run.id, retained_since=run.state_changed_at, discard_at=earliest))
    return out
