"""sweep-account: sweep one compute connection (org, connection name: `aws`, `aws/us-west-2`) for
machines, disks and NICs that bill without a live run, and release them. The sweeper timer sends one message per connection
(shared/services/timers/sweeper.py); an admin's sweep sends the same messages.

One account, in this order:
1. list the connection's marked resources from the cloud (one paged listing);
2. then read the org's runs that matter: the watch index's (those that hold a machine or wait on a
   deadline) and, by point reads, the runs the listed resources name. Never every run the org ever
   had. In this order, so a machine created during the sweep (its run already written ahead of
   the create) is never mistaken for a leak;
3. diff, and act only past the grace period: nothing younger than settings.sweep_grace_s, and
   nothing whose run changed state within it, is touched.

What it does:
- resources of a run that is missing, terminal (released) -> provider.release for that run (deletes
  the machine and its job-created disk / NIC; "not found" is success);
- a run stuck in releasing (its message lost or poisoned, or the cloud refusing) -> release re-sent
  with capped exponential backoff (run.release_after, release_attempts), the error shown on the run;
- a live run whose recorded machine is no longer listed at all, and that a describe of that run
  confirms gone (deleted outside the control plane) -> retaining with the reason; the retain step
  then fails the run with "nothing to retain or release".

Only resources carrying this deployment's mark and this org's mark (or, for providers without tags
such as RunPod, this deployment's name prefix and a run id that is ours) are ever considered, and of
those only this connection's: a resource's connection mark names it, else (RunPod pods, Azure's OS
disk before its tag, machines made before the mark) its run's connection does, else (no run) it is the
provider's default connection's. So two connections that reach one account and region never judge
each other's machines. A finding's `provider` is the connection's name. Every
action and every dry-run finding is an audit event.

Bounded: the cloud calls that act (releases, describes) stop once ACCOUNT_BUDGET_S is spent, well
under functionTimeout; what is left is found again by the next tick. One sweep of an account acts at
a time: it holds the account's lease (shared/store/leases.py, `sweep~<org>~<provider>`), short
(LEASE_S) and renewed at half while it works, so a host that died mid-sweep delays that account
alone by at most LEASE_S. A second delivery of one sweep's message finds the sweep recorded on the lease and does
nothing. A dry run acts on nothing and takes no lease.
"""

from __future__ import annotations

import contextvars
import random
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from shared import metrics
from shared.clock import now, now_ts
from shared.context import Context
from shared.errors import AuthError, ProviderError
from shared.lifecycle import ACTIVE, TERMINAL
from shared.log import get_logger, redact_text
from shared.models import (
    CloudResource,
    ConnectionRecord,
    ConnectionStatus,
    MachineState,
    RunRecord,
    RunState,
    StepMessage,
    SweepMessage,
)
from shared.providers.base import ComputeProvider, RunRef
from shared.runs import candidates
from shared.runs.events import event
from shared.runs.moves import move
from shared.runs.org_backends import compute_connection_slot, compute_of, provider_of, run_connection
from shared.runs.resources import MACHINE_KINDS
from shared.runs.scope import refuse_other_scope, report_credential_failure
from shared.services.steps.release import release_delay
from shared.services.timers.sweeper import ACTIVE_PARTITION, record_report
from shared.steps import Resender, Step, resent_by
from shared.store import leases
from shared.store.installation import installation_id

GONE_STATES = frozenset({"terminated", "deleted"})

# The run states whose lost step message the sweeper re-sends (the step table's: releasing).
RESENDS: dict[RunState, Step] = resent_by(Resender.sweeper)

ProviderFactory = Callable[[ConnectionRecord], ComputeProvider]  # a connection read once per sweep

# The cloud calls that act on one account (releases, describes) start only within this many seconds
# of the sweep's start: with each call bounded by the provider's own waits, one invocation stays
# well under a third of functionTimeout (5 min). What is left is found again by the next tick.
ACCOUNT_BUDGET_S = 60
# An account's sweep lease ends by itself this long after it was last renewed, and the sweep renews
# it at half (before each acting cloud call once half has passed): a host that died mid-sweep blocks
# that one account for at most this, and a slow sweep is never joined by another.
LEASE_S = 90


def lease_name(org: str, connection: str) -> str:
    return f"sweep~{org}~{connection.replace('/', '|')}"  # table keys may not hold '/'


# At most this many sweep-account invocations run at once in one worker process; another one is deferred (the
# message sent again with a delay, the invocation returns at once). A sweep mostly waits on a cloud's listing
# (0.2-0.8 s a call), and the worker runs every invocation (HTTP heartbeats too) on one thread pool of
# min(32, cpu + 4) threads: without this bound the host's 6 queue invocations (batchSize 4 + newBatchThreshold
# 2) of a slow cloud would hold every thread of a 2-core instance. Each invocation sweeps its batch's accounts
# BATCH_THREADS at once on threads of its own, so one instance still sweeps MAX_RUNNING x BATCH_THREADS accounts
# at once (docs/scale.md, "The sweep's cost model").
MAX_RUNNING = 2
BATCH_THREADS = 4
DEFER_S = (15, 45)  # a deferred message's delay, drawn in this range (deferred ones do not come back together)
_running = threading.BoundedSemaphore(MAX_RUNNING)


def sweep_account(ctx: Context, msg: SweepMessage) -> None:
    """The step: sweep the message's accounts (its own and its batch's) once per sweep; the findings are
    audited (and reported for an admin's sweep: shared/services/timers/sweeper.record_report)."""
    if not _running.acquire(blocking=False):
        delay = random.uniform(*DEFER_S)
        get_logger().info("account sweep deferred: this worker runs its most sweeps at once",
                          extra={"org": msg.org, "accounts": 1 + len(msg.batch), "delay_s": round(delay)})
        ctx.queues.send(Step.sweep_account, msg, delay_s=delay)
        return
    try:
        _sweep_batch(ctx, msg)
    finally:
        _running.release()


def _sweep_batch(ctx: Context, msg: SweepMessage) -> None:
    targets = [(msg.org, msg.connection or msg.provider)] + [(t.org, t.connection or t.provider) for t in msg.batch]

    def one(target: tuple[str, str]) -> None:
        org, name = target
        out = sweep_one(ctx, org, name, sweep_id=msg.sweep, dry_run=msg.dry_run)
        if msg.report:
            record_report(ctx, msg.model_copy(update={"org": org, "provider": provider_of(name),
                                                      "connection": name if name != provider_of(name) else "",
                                                      "batch": []}), out)

    if len(targets) == 1:
        one(targets[0])
        return
    # Each account on a copy of this invocation's context (its budget, its log fields; each sweep's lines
    # name their account). An account whose
    # sweep raised is swept again with the whole message (the others find their lease's sweep id: done).
    with ThreadPoolExecutor(max_workers=min(BATCH_THREADS, len(targets))) as pool:
        futures = [pool.submit(contextvars.copy_context().run, one, t) for t in targets]
    for f in futures:
        f.result()


def sweep_one(ctx: Context, org: str, provider_name: str, *, sweep_id: str, dry_run: bool,
              compute: ProviderFactory | None = None) -> dict[str, Any]:
    """Sweep one account; returns {"findings": [...], stats..., "skipped": why (when it did not)}. `compute`
    builds the connection's provider (default: compute_of with this ctx)."""
    build: ProviderFactory = compute or (lambda rec: compute_of(ctx, rec))
    got = ctx.store.connections.get(org, compute_connection_slot(provider_name))
    if got is None or got[0].status == ConnectionStatus.checking:
        return {"findings": [], "skipped": "the connection is gone or being checked"}
    if dry_run:
        return _sweep(ctx, org, provider_name, lambda: build(got[0]), dry_run=True)
    lease = leases.take(ctx, lease_name(org, provider_name), LEASE_S)
    if lease is None:
        get_logger().info("account sweep skipped: another sweep holds its lease",
                          extra={"org": org, "provider": provider_name})
        return {"findings": [], "skipped": "another sweep of this account is running; the next tick sweeps"}
    if lease.data.get("sweep") == sweep_id:
        leases.end(ctx, lease)
        return {"findings": [], "skipped": "this sweep has swept this account already (a second delivery)"}
    out = _sweep(ctx, org, provider_name, lambda: build(got[0]), dry_run=False, lease=lease)
    marked = lease.data.get("active_marked_at")
    if out.get("active") and not (isinstance(marked, (int, float)) and now_ts() - marked < ACTIVE_MARK_EVERY_S):
        mark_active(ctx, org, provider_name)
        marked = now_ts()
    leases.end(ctx, lease, sweep=sweep_id, swept_at=now_ts(), **({"active_marked_at": marked} if marked else {}))
    return out


# The sweeper's tiers (shared/services/timers/sweeper.py): an account whose sweep saw a watched run or a
# listed resource is marked active, and is swept every interval for a day after the last such sweep (every
# other account hourly). The mark lives in the sweeps table's ACTIVE_PARTITION, one row per account, with
# its time as a column the fan-out filters on; written at most every ACTIVE_MARK_EVERY_S per account.
ACTIVE_MARK_EVERY_S = 3600


def mark_active(ctx: Context, org: str, provider: str) -> None:
    # `provider`: the connection's name; a table key may not hold its '/' (spelled '|', as keys.row_key does).

    ctx.store.table("sweeps").upsert(ACTIVE_PARTITION, f"{org}~{provider.replace('/', '|')}",
                                     {"org": org, "provider": provider}, at=now_ts())


class _Budget:
    """The acting cloud calls' time budget, and the lease kept alive while they run."""

    def __init__(self, lease: leases.Lease | None) -> None:
        self.until = now_ts() + ACCOUNT_BUDGET_S
        self.lease = lease
        self.left_over = 0

    def allows(self, ctx: Context) -> bool:
        if now_ts() >= self.until:
            self.left_over += 1
            return False
        if self.lease is not None and self.lease.until - now_ts() < LEASE_S / 2 and not leases.renew(ctx, self.lease,
                                                                                                         LEASE_S):
            self.left_over += 1
            self.until = 0  # the lease was lost (it ran out, another sweep took it): act on nothing more
            return False
        return True


def _listing_failed(ctx: Context, org: str, name: str, exc: Exception, dry_run: bool) -> dict[str, Any]:
    """The finding of a connection whose provider could not be built or list its resources: an expired
    credential also warns its runs."""
    reason = exc.reason if isinstance(exc, ProviderError) else f"{type(exc).__name__}: {redact_text(str(exc))}"
    if not isinstance(exc, ProviderError):
        get_logger().exception("account sweep: the provider could not be built or listed")
    finding: dict[str, Any] = {"org": org, "provider": name, "action": "none",
                               "reason": f"listing failed, nothing swept on this connection: {reason[:500]}"}
    if isinstance(exc, AuthError) and not dry_run:
        finding["warned_runs"] = report_credential_failure(ctx, org, name, exc.reason)
    _audit(ctx, "sweep-list-failed", finding)
    return finding


def _sweep(ctx: Context, org: str, name: str, compute: Callable[[], ComputeProvider], *, dry_run: bool,
           lease: leases.Lease | None = None) -> dict[str, Any]:
    settings, store = ctx.settings, ctx.store
    stats: dict[str, Any] = {"org": org, "provider": name, "listed": 0, "runs_read": 0}
    try:
        provider = compute()
        resources = _ours(provider.list_managed(), settings.deployment_id, org)
    except Exception as exc:  # one broken account (a secret that no longer opens) never poisons the step
        return {**stats, "findings": [_listing_failed(ctx, org, name, exc, dry_run)]}
    if (other := _other_store(ctx, resources)) is not None:
        stats["listed"] = len(resources)
        return {**stats, "findings": [_refuse_duplicate(ctx, org, name, other, dry_run)]}
    # Read after listing the cloud (see the module docstring): the org's watched runs, and the runs
    # the listing names that are not among them (ended runs whose machine is still listed).
    watched = store.runs.get_many(store.watch.ids(org))
    runs = {r.id: r for r in watched}
    named = sorted({r.run_id for r in resources} - set(runs))
    runs.update({r.id: r for r in store.runs.get_many([(org, rid) for rid in named])})
    stats["runs_read"] = len(runs)
    resources = [r for r in resources if _of_connection(r, name, runs)]
    stats["listed"] = len(resources)
    stats["active"] = bool(watched or resources)
    t, budget = now(), _Budget(lease)
    findings = _leaks(ctx, org, name, provider, resources, runs, t, dry_run, budget)
    findings += _vanished(ctx, org, name, provider, resources, runs, t, dry_run, budget)
    findings += _low_credit(ctx, org, name, provider, runs, t, dry_run)
    findings += _stuck_releases(ctx, org, (r for r in runs.values() if run_connection(r) == name), t, dry_run)
    if budget.left_over:
        stats["left_for_next_tick"] = budget.left_over
    get_logger().info("account swept", extra={"dry_run": dry_run, **stats, "findings": len(findings)})
    if not dry_run:
        metrics.record_sweep(finding_kinds(findings))
    return {**stats, "findings": findings}


# A finding's action -> its kind in the tensorant.sweep.findings metric (the template's alerts read "leak").
KINDS = {"release": "leak", "retain": "vanished", "re-send release": "stuck_release", "warn": "low_credit"}


def finding_kinds(findings: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for f in findings:
        out[KINDS.get(str(f.get("action")), "other")] += 1
    return dict(out)


def _other_store(ctx: Context, resources: list[CloudResource]) -> str | None:
    """The installation id of another state store whose resources carry this deployment's marks, or
    None (resources made before the mark existed carry none and count as this store's)."""
    mine = installation_id(ctx)
    return next((r.extra["store"] for r in resources if r.extra.get("store") and r.extra["store"] != mine), None)


def _refuse_duplicate(ctx: Context, org: str, name: str, other: str, dry_run: bool) -> dict[str, Any]:
    reason = (f"another control plane (state store {other}) uses this deployment id "
              f"({ctx.settings.deployment_id}) on this {name} account: nothing is swept here, since each would "
              "take the other's machines for leaks. Give one of the two deployments its own "
              "TENSORANT_DEPLOYMENT_ID (its running runs keep their marks: finish or cancel them first)")
    finding: dict[str, Any] = {"org": org, "provider": name, "action": "none", "reason": reason}
    get_logger().error("sweep refused: a second deployment uses this deployment id", extra=finding)
    _audit(ctx, "sweep-dry-run" if dry_run else "sweep-refused-duplicate-deployment", finding)
    return finding


def _audit(ctx: Context, kind: str, finding: dict[str, Any]) -> None:
    # The audit record's own "action" is its kind; the finding's action goes in as "decision".
    ctx.store.audit.add(kind, **{("decision" if k == "action" else k): v for k, v in finding.items()})


def _ours(resources: Iterable[CloudResource], deployment: str, org: str) -> list[CloudResource]:
    # RunPod pods carry no tags: their name holds the deployment and run, not the org (org == "").
    # A resource listed as already terminated or deleted (EC2 shows terminated instances for
    # a while) bills nothing and counts as absent.
    return [r for r in resources if r.managed and r.deployment == deployment and r.run_id and r.org in (org, "")
            and r.state.lower() not in GONE_STATES]


def _of_connection(res: CloudResource, connection: str, runs: dict[str, RunRecord]) -> bool:
    """Whether the listed resource is the connection's to judge (see the module docstring)."""
    mark = res.extra.get("connection")
    if mark:
        return mark == connection
    run = runs.get(res.run_id)
    if run is not None:
        return run_connection(run) == connection
    return connection == provider_of(connection)


def _grace(ctx: Context) -> timedelta:
    return timedelta(seconds=ctx.settings.sweep_grace_s)


def _leaks(ctx: Context, org: str, provider_name: str, provider: ComputeProvider, resources: list[CloudResource],
           runs: dict[str, RunRecord], t: datetime, dry_run: bool, budget: _Budget) -> list[dict[str, Any]]:
    """Resources past the grace whose run is missing or terminal, or whose launch attempt the run gave up:
    released (a dry run only reports them)."""
    # Grouped by run and launch attempt (issue 37): a live run owns only its current attempt's resources; an
    # attempt it gave up (another candidate refused) is released here like a leak once past the grace.
    by_run: dict[tuple[str, int], list[CloudResource]] = defaultdict(list)
    for res in resources:
        by_run[(res.run_id, res.attempt)].append(res)
    out = []
    for (run_id, attempt), found in sorted(by_run.items()):
        reason = _leak_reason(ctx, runs.get(run_id), run_id, attempt, found, t)
        if reason is None:
            continue
        if not dry_run and not budget.allows(ctx):
            continue  # the budget is spent: the next tick finds it again
        finding: dict[str, Any] = {
            "org": org, "provider": provider_name, "run_id": run_id, "reason": reason,
            "resources": [f"{r.kind}:{r.id}" for r in found],
            "action": "would release" if dry_run else "release",
        }
        if not dry_run:
            finding |= _release(provider, RunRef(ctx.settings.deployment_id, org, run_id, attempt=attempt), found)
        _audit(ctx, "sweep-dry-run" if dry_run else "sweep-release", finding)
        out.append(finding)
    return out


def _leak_reason(ctx: Context, run: RunRecord | None, run_id: str, attempt: int, found: list[CloudResource],
                 t: datetime) -> str | None:
    """Why one launch attempt's resources are a leak; None while they are not one (yet)."""
    if run is None and any(r.org == "" for r in found):
        # Untagged (RunPod) and not this org's run: another org may share the account. Run
        # ids are never deleted, so a real leak of this org always finds its run.
        return None
    gave_up = run is not None and run.state not in TERMINAL and candidates.abandoned(run, attempt)
    if run is not None and run.state not in TERMINAL and not gave_up:
        return None  # a live run owns it; its own steps release or retain it
    if not _past_grace(ctx, run, run_id, found, t, gave_up):
        return None
    if gave_up:
        return f"launch attempt {attempt + 1} of its run was given up (another candidate was tried)"
    return "its run is missing" if run is None else f"its run is {run.state.value} (released)"


def _past_grace(ctx: Context, run: RunRecord | None, run_id: str, found: list[CloudResource], t: datetime, gave_up: bool) -> bool:
    """Whether the resources and their run's last change are older than the grace period."""
    grace = _grace(ctx)
    if run is None:
        if any(r.created_at is None for r in found):
            # No creation time and no run to date it: count from the first sighting.
            return _seen_before(ctx, run_id, found, t)
        # Younger: being created right now, or listed late.
        return not any(t - r.created_at < grace for r in found if r.created_at)
    if any(r.created_at and t - r.created_at < grace for r in found):
        return False
    return gave_up or t - run.state_changed_at >= grace


def _release(provider: ComputeProvider, ref: RunRef, found: list[CloudResource]) -> dict[str, Any]:
    """The release of leaked resources, as the finding records it ("not found" is success)."""
    try:
        got = provider.release(ref, found)
    except ProviderError as exc:
        return {"done": False, "detail": exc.reason}
    return {"done": got.done, "detail": got.detail}


def _seen_before(ctx: Context, run_id: str, found: list[CloudResource], t: datetime) -> bool:
    """For resources the cloud gives no creation time (RunPod pods): the first sighting is
    written to the ledger, and the grace period counts from there."""
    store, grace = ctx.store, _grace(ctx)
    ledger = {(r.kind, r.id): r for r in store.ledger.read(run_id)}
    old = True
    for res in found:
        seen = ledger.get((res.kind, res.id))
        if seen is None or seen.created_at is None:
            store.ledger.record(res.model_copy(update={"created_at": t, "state": "sighted by the sweeper"}))
            old = False
        elif t - seen.created_at < grace:
            old = False
    return old


def _vanished(ctx: Context, org: str, provider_name: str, provider: ComputeProvider, resources: list[CloudResource],
              runs: dict[str, RunRecord], t: datetime, dry_run: bool, budget: _Budget) -> list[dict[str, Any]]:
    """A live run whose recorded machine is not in the listing at all may have been deleted
    outside the control plane. A listing can be wrong (a filter, a region), so absence alone
    never stops a machine: the cloud is asked about that run (a describe only for such runs,
    which are rare), and only a confirmed "gone" moves it to retaining; the retain step then
    fails it with "nothing to retain or release"."""
    listed_runs = _listed_runs(resources, runs)
    out: list[dict[str, Any]] = []
    for run in runs.values():
        if run_connection(run) != provider_name or run.state not in ACTIVE or run.id in listed_runs:
            continue
        machines = [r for r in run.resources if r.kind in MACHINE_KINDS]
        if not machines or not _unlisted_past_grace(ctx, run, machines, t):
            continue
        problem = _other_scope(run, provider)
        if problem is not None:
            out.append({"org": org, "provider": provider_name, "run_id": run.id, "action": "none", "reason": problem})
            continue
        if not budget.allows(ctx) or not _confirmed_gone(ctx, provider, org, run):
            continue
        why = "the machine is gone from the cloud (deleted outside the control plane)"
        finding = {"org": org, "provider": provider_name, "run_id": run.id, "reason": why,
                   "resources": [f"{r.kind}:{r.id}" for r in machines],
                   "action": "would retain" if dry_run else "retain"}
        if not _retain_vanished(ctx, run, why, dry_run):
            continue
        _audit(ctx, "sweep-dry-run" if dry_run else "sweep-retain", finding)
        out.append(finding)
    return out


def _other_scope(run: RunRecord, provider: ComputeProvider) -> str | None:
    """Why the run is not judged from here: launched in another scope (the connection was moved since), it is
    not listed here and "gone" here, but alive where it was made. Never judged from the wrong account."""
    try:
        refuse_other_scope(run, provider)
    except ProviderError as exc:
        return exc.reason
    return None


def _listed_runs(resources: list[CloudResource], runs: dict[str, RunRecord]) -> set[str]:
    """The runs whose machine is listed. A given-up attempt's machine listed under the run is not the run's
    machine (issue 37)."""
    return {r.run_id for r in resources
            if r.run_id not in runs or r.attempt == candidates.attempt_no(runs[r.run_id])}


def _unlisted_past_grace(ctx: Context, run: RunRecord, machines: list[CloudResource], t: datetime) -> bool:
    """Whether the run and its machines are older than the grace period: a younger machine may be listed late."""
    grace = _grace(ctx)
    if t - run.state_changed_at < grace:
        return False
    return not any(r.created_at and t - r.created_at < grace for r in machines)


def _confirmed_gone(ctx: Context, provider: ComputeProvider, org: str, run: RunRecord) -> bool:
    """The cloud, asked about the run, says its machine is gone (an error confirms nothing: the heartbeat
    deadline still covers it)."""
    try:
        ref = RunRef(ctx.settings.deployment_id, org, run.id, attempt=candidates.attempt_no(run))
        return provider.describe(ref, run.resources).state == MachineState.gone
    except ProviderError:
        return False


def _retain_vanished(ctx: Context, run: RunRecord, why: str, dry_run: bool) -> bool:
    """The run moved to retaining (the retain step then fails it); False when it had moved on meanwhile. A dry run
    moves nothing."""
    if dry_run:
        return True
    _, wrote = move(ctx, run, RunState.retaining, expect={run.state}, reason=why)
    if wrote:
        ctx.queues.send(Step.retain, StepMessage(org=run.org, run_id=run.id, reason="sweeper"))
    return wrote


# A low-credit warning is repeated on a retained run at most this often.
CREDIT_WARNING_EVERY_S = 24 * 3600


def _low_credit(ctx: Context, org: str, provider_name: str, provider: ComputeProvider, runs: dict[str, RunRecord], t: datetime,
                dry_run: bool) -> list[dict[str, Any]]:
    """Prepaid accounts (RunPod) stop and then delete pods when the credit runs out, retained disks
    included: warn on each retained run while the provider says its credit is low (one read per
    tick and connection, only when a run is retained; at most one warning a day per run)."""
    retained = [r for r in runs.values() if run_connection(r) == provider_name and r.state == RunState.retained]
    message = _credit_warning(provider) if retained else ""
    out: list[dict[str, Any]] = []
    for run in retained if message else []:
        if _warned_recently(ctx, run, t):
            continue
        finding = {"org": org, "provider": provider_name, "run_id": run.id, "reason": message,
                   "action": "would warn" if dry_run else "warn"}
        if not dry_run:
            event(ctx, run, "warning", message + " This run is retained: recover or release it soon.", credit=True)
        _audit(ctx, "sweep-dry-run" if dry_run else "sweep-credit-warning", finding)
        out.append(finding)
    return out


def _credit_warning(provider: ComputeProvider) -> str:
    """The provider's low-credit warning; "" when it has none, declares none, or cannot say."""
    warning_of = getattr(provider, "credit_warning", None)
    if not callable(warning_of):
        return ""
    try:
        return str(warning_of() or "")
    except ProviderError:
        return ""


def _warned_recently(ctx: Context, run: RunRecord, t: datetime) -> bool:
    return any(e.data.get("credit") and (t - e.at).total_seconds() < CREDIT_WARNING_EVERY_S
               for e in ctx.store.events.read(run.id, kind="warning"))


def _stuck_releases(ctx: Context, org: str, runs: Iterable[RunRecord], t: datetime, dry_run: bool) -> list[dict[str, Any]]:
    """Runs in releasing whose next attempt is due: re-send release, and push release_after
    out by a capped exponential backoff so a release that keeps failing is not hammered."""
    grace, store = _grace(ctx), ctx.store
    out = []
    for run in runs:
        if run.state not in RESENDS:
            continue
        if run.release_after is not None and run.release_after > t:
            continue
        if run.release_after is None and t - run.state_changed_at < grace:
            continue  # its first release message is most likely still on its way
        attempts = run.release_attempts + 1
        delay = release_delay(ctx, attempts)
        error = run.release_error or "the release was not confirmed (its message may have been lost)"
        finding = {"org": org, "provider": run_connection(run), "run_id": run.id, "reason": error,
                   "resources": [f"{r.kind}:{r.id}" for r in run.resources], "attempt": attempts,
                   "next_in_s": int(delay), "action": "would re-send release" if dry_run else "re-send release"}
        if not dry_run:
            update = {"release_attempts": attempts, "release_error": error, "updated_at": t,
                      "release_after": t + timedelta(seconds=delay)}
            _, wrote = store.runs.mutate(org, run.id, _retry_due(run.release_after, update))
            if not wrote:
                continue
            # Written before sent: a crash in between delays the retry by one backoff, never loses it.
            ctx.queues.send(RESENDS[run.state], StepMessage(org=org, run_id=run.id, reason="sweeper"))
        _audit(ctx, "sweep-dry-run" if dry_run else "sweep-release-retry", finding)
        out.append(finding)
    return out


def _retry_due(due: datetime | None, update: dict[str, Any]) -> Callable[[RunRecord], RunRecord | None]:
    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in RESENDS or r.release_after != due:
            return None  # the step (or another sweep) got there first
        return r.model_copy(update=update)

    return change
