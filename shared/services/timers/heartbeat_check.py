"""heartbeat-check: deadlines per phase, and re-sending messages a crash may have lost.

Every limit is enforced here, by the control plane; no provider-side timer is trusted
to stop billing. Deadlines (set on the run):
- provisioning_by, the boot deadline: the agent must report before it (machine start and
  image pull included). A machine that misses it never started training, so nothing on it
  can be recovered: the run is released and failed, not retained, and the release step adds
  the cloud's account of the machine to the reason (shared/services/boot.py);
- heartbeat_by: pushed forward by every heartbeat; silence past it means the agent is gone;
- runtime_by: the run's total runtime limit, counted from launch.
A missed deadline after the agent reported retains the run with the reason (the machine is
stopped, the disk kept for recovery). A run still queued at its provisioning deadline never
got a machine (the launch step writes provisioning before any cloud call), so it fails with
nothing to release. Whether the machine still exists is the retain step's question: one that
vanished outside the control plane fails the run with "nothing to retain or release".

A retained run is held to its org's retention limit (OrgLimits.retention_limit_s): its owner is warned by
an event before it, and at it the run is discarded (shared/runs/retention.py). A run that misses a deadline
before it ever trained is marked so that the retain step releases it when no checkpoint of it was saved.

A retained machine started for recovery bills for its GPU: once it has been up
settings.recovery_idle_stop_s, a stop-idle message stops it (shared/services/steps/stop_idle.py), so
this timer never waits on a cloud call.

What one tick reads: the watch index (the runs that hold a machine or wait on a deadline, kept by the
one state-change write: shared/store/watch.py), then those runs by point reads, in parallel. Its cost grows
with the active runs, never with the runs ever kept; a write only for a run that acts. An index row
whose run has left the watched states (a crash between the run's write and the row's delete) is
pruned once that run has been quiet for PRUNE_AFTER_S.
"""

from __future__ import annotations

from datetime import datetime

from shared import metrics
from shared.clock import now
from shared.context import Context
from shared.lifecycle import ACTIVE, transition, walk
from shared.log import get_logger
from shared.models import Outcome, RetentionCountdown, RunRecord, RunState, StepMessage
from shared.providers import registry
from shared.runs import budgets
from shared.runs.cloud_report import BOOT_FAILED
from shared.runs.events import event
from shared.runs.moves import move, move_stored
from shared.runs.org_limits import OrgLimits, get_limits
from shared.runs.outbox import drain_stale
from shared.runs.retention import UNTRAINED, RetentionAction, never_trained, retention_action
from shared.steps import Resender, Step, resent_by
from shared.store.watch import WATCHED

# A run sitting in one of these states this long with no sign of its step lost its message (a
# crash between the write and the send, or a poisoned message): send it again, at most
# once per this interval (the run's resent_at marks it); the steps ignore duplicates.
# Which step serves which state is the step table's (releasing is the sweeper's, with backoff).
RESEND_AFTER_S = 300
RESEND: dict[RunState, Step] = resent_by(Resender.heartbeat_check)

# A run still verifying (or recovering) this long after it got there has a verify-adapter
# step that keeps failing (storage unreachable, a message poisoned and re-sent above): the
# re-sends alone would keep a verifying run's machine billing for ever. Give up: verifying
# -> retaining (stop it, keep the disk), recovering -> retained, with the last step error.
VERIFY_LIMIT_S = 1800
# Keyed by the states the verify-adapter step serves (tests/test_steps.py checks they agree).
VERIFY_GIVE_UP = {RunState.verifying: RunState.retaining, RunState.recovering: RunState.retained}


# The control plane's own liveness: each tick records when it ran. A tick that finds the previous one
# older than OUTAGE_AFTER_S (the timer fires every minute) follows an outage of the control plane or of
# its state store (a tick cannot run without the store): a new serving period starts, and no agent is
# judged silent, or late for its boot, until the control plane has served a full heartbeat interval
# (heartbeat_timeout_s) since. Agents could not get a heartbeat in while nothing was serving.
# The record is clamped against the clock itself: a tick that finds the previous one in its future (the
# clock went back, or an instance whose clock is behind another's) or further in its past than a few ticks
# (the clock jumped forward) reads it as such an outage, as a restart is; the record then holds this tick's
# time, so a clock that comes back never leaves the serving period in the future. A serving period is
# thereby one steady clock: what is counted on it (the retention warning's interval) is counted again
# after any jump.
LIVENESS = ("~", "liveness")  # a row of the watch table's "~" partition (no org is "~")
OUTAGE_AFTER_S = 180


def serving_since(ctx: Context, t: datetime) -> datetime:
    """When the control plane's current serving period began (recorded, and continued, by this tick)."""
    table, ts = ctx.store.table("watch"), t.timestamp()
    got = table.get(*LIVENESS)
    last = float(got[0].get("last_tick", 0)) if got else 0.0
    since = float(got[0].get("serving_since", ts)) if got else ts
    if not got or not 0 <= ts - last <= OUTAGE_AFTER_S or since > ts:
        since = ts
    table.upsert(*LIVENESS, {"org": "~", "run_id": "~", "last_tick": ts, "serving_since": since})
    return datetime.fromtimestamp(since, tz=t.tzinfo)


def serving_long_enough(ctx: Context, t: datetime, since: datetime | None) -> bool:
    """Whether the control plane has served a full heartbeat interval on this clock (see serving_since)."""
    return since is None or (t - since).total_seconds() > ctx.settings.heartbeat_timeout_s


def missed_deadline(ctx: Context, run: RunRecord, t: datetime, since: datetime | None = None) -> str | None:
    """Why the run has missed a deadline at `t`, or None. `since`: when the control plane's current
    serving period began; silence and boot deadlines count only after a full heartbeat interval of it
    (the runtime limit is absolute for a run that may hold output, which it retains: what was bought is all
    that is paid)."""
    d = run.deadlines
    steady = serving_long_enough(ctx, t, since)
    # A run that holds output is only retained (recoverable) at its runtime limit, on any clock; one still
    # provisioning is released and failed, so only on a clock that has been steady a heartbeat interval.
    if d.runtime_by and t > d.runtime_by and (steady or run.state != RunState.provisioning):
        return f"the run's runtime limit of {run.runtime_limit_s} s was reached"
    if not steady:
        return None  # the control plane itself was not serving a heartbeat interval ago
    if (run.state == RunState.provisioning and d.first_report_by and t > d.first_report_by
            and run.bootstrap_claimed_at is None):
        return ("the machine never reached the control plane by its first-report deadline (minutes after its "
                "create call: it did not boot, or has no route to TENSORANT_PUBLIC_URL)" + _refused(ctx, run))
    if run.state == RunState.provisioning and d.provisioning_by and t > d.provisioning_by:
        return (f"the agent did not report within the boot deadline of {ctx.settings.provisioning_timeout_s} s "
                "(TENSORANT_PROVISIONING_TIMEOUT_S: machine start and image pull included)" + _refused(ctx, run))
    if run.state in ACTIVE and run.state != RunState.provisioning and d.heartbeat_by and t > d.heartbeat_by:
        return "the agent's heartbeat went silent" + _refused(ctx, run)
    return None


def _refused(ctx: Context, run: RunRecord) -> str:
    """Why the agent's calls were refused, with what to check. Only a token whose signature verifies is
    noted (services/api/agent._note_refused), so a rotated-out key never shows here: an expired token does,
    after the agent lost its route for longer than the token's lifetime or was stopped that long."""
    if not run.agent_refused:
        return ""
    hint = (" (the agent could not renew its token in time: it lost its route to TENSORANT_PUBLIC_URL, or its "
            f"machine was stopped for longer than TENSORANT_AGENT_TOKEN_TTL_S, {ctx.settings.agent_token_ttl_s} s)"
            if "expired" in run.agent_refused else "")
    return f"; its calls were refused: {run.agent_refused}{hint}"


# An index row whose run is no longer watched is deleted once the run has been quiet this long: a
# write that indexes a run before moving it (store.runs.mutate) is never in flight longer.
PRUNE_AFTER_S = 900


def watched_runs(ctx: Context, t: datetime) -> tuple[list[RunRecord], int]:
    """The runs of the watch index that are still watched, and how many stale rows were pruned."""
    store = ctx.store
    store.runs.build_watch_index()  # once per deployment: runs recorded before the index existed
    keys = store.watch.ids()
    found = {(r.org, r.id): r for r in store.runs.get_many(keys)}
    pruned = 0
    for key in keys:
        run = found.get(key)
        if run is not None and run.notices:
            drain_stale(ctx, [run], t)  # webhook notices a crash left behind (shared/runs/outbox.py)
        if run is not None and (run.state in WATCHED or run.notices):
            continue
        if run is None or (t - max(run.state_changed_at, run.updated_at)).total_seconds() > PRUNE_AFTER_S:
            store.watch.remove(*key)
            pruned += 1
    return [r for r in found.values() if r.state in WATCHED], pruned


def fleet_metrics(runs: list[RunRecord]) -> None:
    """The fleet as operators watch it (shared/metrics.py), from the runs this tick read anyway: active
    runs by state, machines held by provider, and what they cost an hour (the price recorded at launch)."""
    by_state: dict[str, int] = {}
    machines: dict[str, int] = {}
    per_hour: dict[str, float] = {}
    for run in runs:
        by_state[run.state.value] = by_state.get(run.state.value, 0) + 1
        if run.resources:
            machines[run.provider] = machines.get(run.provider, 0) + 1
            running = run.state != RunState.retained or run.machine_started_at is not None
            rate = run.offer.total_per_hour if running else run.offer.disk_per_hour
            per_hour[run.provider] = per_hour.get(run.provider, 0.0) + rate
    # Every state and provider each time, a zero for none: a gauge left out keeps its last value.
    providers = list(registry.providers())
    metrics.gauges(metrics.RUNS, "state", by_state, [s.value for s in WATCHED])
    metrics.gauges(metrics.MACHINES_BILLING, "provider", machines, providers)
    metrics.gauges(metrics.COST_PER_HOUR, "provider", {p: round(v, 4) for p, v in per_hour.items()}, providers)


def check_all(ctx: Context) -> dict[str, int]:
    t = now()
    counts = {"watched": 0, "retained": 0, "failed": 0, "resent": 0, "idle_stops_sent": 0, "pruned": 0,
              "retention_warned": 0, "discarded": 0, "verified_at_limit": 0}
    limits: dict[str, OrgLimits] = {}  # read once per org in a tick, only for orgs with a retained run
    since = serving_since(ctx, t)
    runs, counts["pruned"] = watched_runs(ctx, t)
    counts["watched"] = len(runs)
    fleet_metrics(runs)
    for run in runs:
        if run.state == RunState.retained:
            if run.org not in limits:
                limits[run.org] = get_limits(ctx, run.org)
            _check_retained(ctx, run, limits[run.org], t, since, counts)
        else:
            _check_watched(ctx, run, t, since, counts)
    for org in sorted({r.org for r in runs}):  # budgets: only orgs with active runs can spend more
        try:
            budgets.check_thresholds(ctx, org, t)
        except Exception:
            get_logger().exception("budget check failed", extra={"org": org})
    return counts


def _check_retained(ctx: Context, run: RunRecord, limits: OrgLimits, t: datetime, since: datetime,
                    counts: dict[str, int]) -> None:
    """A retained run: discarded or warned as its retention says, and its machine stopped once idle."""
    action = retention_action(run, limits, t, since)
    if action is not None and action.kind == "discard":
        counts["discarded"] += _discard(ctx, run, action.message)
        return
    if action is not None:
        counts["retention_warned"] += _warn_retention(ctx, run, action, t, since)
    started = run.machine_started_at
    if started is not None and (t - started).total_seconds() > ctx.settings.recovery_idle_stop_s:
        ctx.queues.send(Step.stop_idle, StepMessage(org=run.org, run_id=run.id, reason="idle"))
        counts["idle_stops_sent"] += 1


def _check_watched(ctx: Context, run: RunRecord, t: datetime, since: datetime, counts: dict[str, int]) -> None:
    """Any other watched run: a missed deadline, a queued run never launched, a verification that takes too
    long, or a step message that seems lost (re-sent)."""
    why = missed_deadline(ctx, run, t, since) if run.state in ACTIVE else None
    if why:
        _missed(ctx, run, why, t, counts)
    elif (run.state == RunState.queued and run.deadlines.provisioning_by and t > run.deadlines.provisioning_by
          and serving_long_enough(ctx, t, since)):
        counts["failed"] += _fail_queued(ctx, run)
    elif run.state in VERIFY_GIVE_UP and (t - run.state_changed_at).total_seconds() > VERIFY_LIMIT_S:
        counts["retained"] += _give_up_verify(ctx, run)
    elif run.state in RESEND and _quiet_for(run, t) > RESEND_AFTER_S:
        if run.state == RunState.provisioning and run.resources:
            return  # launched; waiting for the agent is the deadlines' job
        counts["resent"] += _resend(ctx, run, t)


def _missed(ctx: Context, run: RunRecord, why: str, t: datetime, counts: dict[str, int]) -> None:
    """An active run past a deadline: failed before it started, verified when it had trained to the end, else
    retained."""
    if run.state == RunState.provisioning:
        counts["failed"] += _release_unstarted(ctx, run, why)
    elif _trained_to_the_end(run, t):
        counts["verified_at_limit"] += _verify_finished(ctx, run, why)
    else:
        counts["retained"] += _retain(ctx, run, why)


def _quiet_for(run: RunRecord, t: datetime) -> float:
    """How long the run has sat in its state with no sign of its step: no re-send, no launch claim."""
    marks = [m for m in (run.resent_at, run.launch_claimed_at) if m is not None]
    return (t - max([run.state_changed_at, *marks])).total_seconds()


def _trained_to_the_end(run: RunRecord, t: datetime) -> bool:
    """At the runtime limit, the trainer had done every planned step (it reports progress 1.0 at the last):
    what runs then is its final eval and its samples, after it wrote the final adapter, which the agent uploads
    at once (machine/agent/trainer.py). Not a run to retain as if its training had stopped short."""
    limit = run.deadlines.runtime_by
    return run.state == RunState.training and run.progress >= 1.0 and limit is not None and t > limit


def _verify_finished(ctx: Context, run: RunRecord, why: str) -> int:
    """Verify the finished training's adapter in storage instead of retaining the run: the heartbeat reply then
    says stop (the final eval and samples are cut), verified it succeeds; a checkpoint or nothing there retains
    it as before (verify_adapter says which)."""
    since = run.state_changed_at
    reason = (why + " after the training finished all its planned steps, while the trainer ran its final eval and "
              "samples: those are cut, and the final adapter it wrote is verified")

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.training or r.state_changed_at != since or r.progress < 1.0:
            return None
        moved = transition(walk(r, RunState.exporting), RunState.verifying, reason=reason)
        return moved.model_copy(update={"finished_at_limit": True})

    moved, wrote = move_stored(ctx, run.org, run.id, change)
    if not wrote:
        return 0
    event(ctx, moved, "warning", reason)
    ctx.queues.send(Step.verify_adapter, StepMessage(org=run.org, run_id=run.id))
    return 1


def _retain(ctx: Context, run: RunRecord, why: str) -> int:
    if never_trained(run):
        # Nothing was trained, so nothing is on the disk unless a checkpoint reached storage anyway: the
        # retain step asks storage (a cloud call this timer does not wait on) and releases it if not.
        _, wrote = move(ctx, run, RunState.retaining, expect=UNTRAINED, release_if_nothing_saved=True,
                        reason=why + "; nothing had been trained: the machine is released, not kept, unless a "
                                     "checkpoint of it is in storage")
    else:
        _, wrote = move(ctx, run, RunState.retaining, expect=ACTIVE,
                        reason=why + "; the machine is stopped and its disk kept")
    if not wrote:
        return 0
    ctx.queues.send(Step.retain, StepMessage(org=run.org, run_id=run.id, reason="deadline"))
    return 1


def _discard(ctx: Context, run: RunRecord, why: str) -> int:
    """Past the org's retention limit: released as a discard is (machine and disk), ended failed."""
    since = run.state_changed_at

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.retained or r.state_changed_at != since:
            return None  # recovered, resumed or cancelled meanwhile
        return transition(r, RunState.releasing, reason=why, outcome=Outcome.failed)

    new, wrote = move_stored(ctx, run.org, run.id, change)
    if not wrote:
        return 0
    # Written before sent: a crash in between leaves a run in releasing, which the sweeper retries.
    ctx.queues.send(Step.release, StepMessage(org=run.org, run_id=run.id, reason="retention"))
    return 1


def _warn_retention(ctx: Context, run: RunRecord, action: RetentionAction, t: datetime, period: datetime) -> int:
    """The owner's warning, once per stay in retained, and the countdown to the discard on this serving
    period's clock (started again, silently, on a new period). The mark is written first: a crash in between
    loses the event, never repeats it every minute; the run view says the date anyway."""
    since = run.state_changed_at

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != RunState.retained or r.state_changed_at != since:
            return None
        countdown = RetentionCountdown(stay=since, period=period, started=t)
        update: dict[str, object] = {"retention_countdown": countdown}
        if action.kind == "warn":
            update["retention_warned_at"] = t
        return r.model_copy(update=update)

    new, wrote = ctx.store.runs.mutate(run.org, run.id, change)
    if not wrote or action.kind != "warn":
        return 0
    event(ctx, new, "warning", action.message, type="run.retention_warning")
    return 1


def _release_unstarted(ctx: Context, run: RunRecord, why: str) -> int:
    _, wrote = move(ctx, run, RunState.releasing, expect={RunState.provisioning}, outcome=Outcome.failed,
                    reason=why + "; nothing ran on the machine, so it is released with its disk, not kept")
    if not wrote:
        return 0
    metrics.count(metrics.FAILED_STARTS, cause="no report by the boot deadline", provider=run.provider)
    ctx.queues.send(Step.release, StepMessage(org=run.org, run_id=run.id, reason=BOOT_FAILED))
    return 1


def _give_up_verify(ctx: Context, run: RunRecord) -> int:
    errors = [e.message for e in ctx.store.events.read(run.id, kind="step-error")]
    why = f"the adapter could not be verified within {VERIFY_LIMIT_S // 60} min"
    why += f" (last error: {errors[-1]})" if errors else ""
    if run.state == RunState.verifying:
        why += "; the machine is stopped and its disk kept: recover once the cause is fixed"
    else:
        why += "; the machine and disk are still retained: recover again once the cause is fixed, or cancel " \
               "with discard"
    since = run.state_changed_at

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != run.state or r.state_changed_at != since:
            return None
        return transition(r, VERIFY_GIVE_UP[r.state], reason=why)

    new, wrote = move_stored(ctx, run.org, run.id, change)
    if not wrote:
        return 0
    if new.state == RunState.retaining:
        ctx.queues.send(Step.retain, StepMessage(org=run.org, run_id=run.id, reason="verify-timeout"))
    return 1


def _fail_queued(ctx: Context, run: RunRecord) -> int:
    _, wrote = move(ctx, run, RunState.releasing, expect={RunState.queued}, outcome=Outcome.failed,
                    reason="the launch never started before the provisioning deadline; no machine was created, "
                           "nothing bills")
    if not wrote:
        return 0
    ctx.queues.send(Step.release, StepMessage(org=run.org, run_id=run.id, reason="deadline"))
    return 1


def _resend(ctx: Context, run: RunRecord, t: datetime) -> int:
    seen = (run.state_changed_at, run.resent_at, run.launch_claimed_at)

    def change(r: RunRecord) -> RunRecord | None:
        if r.state != run.state or (r.state_changed_at, r.resent_at, r.launch_claimed_at) != seen:
            return None  # it moved, was re-sent by another tick, or its step claimed it meanwhile: not lost
        return r.model_copy(update={"resent_at": t, "updated_at": t})

    _, wrote = ctx.store.runs.mutate(run.org, run.id, change)
    if not wrote:
        return 0
    # Written before sent: a crash in between delays the resend by one interval, never loses it.
    ctx.queues.send(RESEND[run.state], StepMessage(org=run.org, run_id=run.id, reason="resend"))
    return 1
