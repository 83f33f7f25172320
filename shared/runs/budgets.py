"""Monthly budgets (USD, per organization and per project: OrgLimits) and the committed spend they hold.

Committed spend = billed this calendar month (UTC) + for every active run the most it can still cost (its
hourly price x the rest of its runtime limit; a retained run's disk until its retention limit) + launches
under way (reserved, not written yet). A launch whose own maximum (price at launch x runtime limit) would
take committed spend over a budget is refused (409), atomically, with the discipline of max_active_runs
(shared/store/slots.py): every launch adds its reservation to one ETag-guarded quotas row of the org, so two
launches racing for the last dollars cannot both pass (the second write is refused, re-reads and counts the
first). A reservation counts until its run holds a machine (then the run counts itself) or, still a draft,
for LAUNCH_GRACE_S.

Thresholds (default 50/80/100 %) are crossed by billed spend; heartbeat-check looks at an org with active runs
at most every CHECK_EVERY_S: a crossing is an audit line and a budget.threshold webhook (sent before it is
recorded, under an id derived from the month and threshold, so a crash re-sends it, never under a new id). At
100 % with stop_at_budget the org's active runs are retained (machine stopped, disk kept, recoverable).

Billed this month reads the org's runs (one query); a run that began before the month counts the share of
its cost its time in this month makes (spread evenly over its billed time).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.clock import now, now_ts
from shared.context import Context
from shared.errors import ConcurrencyError, Conflict, NotFound
from shared.lifecycle import ACTIVE, HOLDS_MACHINE, TERMINAL, transition
from shared.models import RunRecord, RunState, StepMessage
from shared.runs.candidates import dearest_price
from shared.runs.costs import timing
from shared.runs.moves import move_stored
from shared.runs.org_limits import OrgLimits, get_limits
from shared.runs.outbox import send_event
from shared.steps import Step
from shared.store.leases import ends, left
from shared.store.slots import LAUNCH_GRACE_S  # one grace for a launch's reservations
from shared.store.tables import MAX_RACE_RETRIES

RESERVATIONS_KEY = "budget-launches"
CHECK_EVERY_S = 300


def hourly_price(run: RunRecord) -> float:
    """The hourly price budgets use: the dearest remaining candidate's (a launch may end on any of them)."""
    return float(dearest_price(run))


def month_start(t: datetime) -> datetime:
    t = t.astimezone(UTC)
    return datetime(t.year, t.month, 1, tzinfo=UTC)


def month_of(t: datetime) -> str:
    return month_start(t).strftime("%Y-%m")


def billed_in_month(ctx: Context, run: RunRecord, t: datetime) -> float:
    if run.launched_at is None:
        return 0.0
    start = month_start(t)
    if run.state in TERMINAL and run.state_changed_at < start:
        return 0.0
    tm = timing(ctx, run, at=t)
    if tm.cost <= 0 or run.launched_at >= start:
        return tm.cost
    began = tm.machine_up_at or run.launched_at
    end = tm.released_at or (run.state_changed_at if run.state in TERMINAL else t)
    span = (end - began).total_seconds()
    if span <= 0:
        return 0.0
    return tm.cost * max(0.0, (end - max(began, start)).total_seconds()) / span


def max_remaining(run: RunRecord, t: datetime, limits: OrgLimits) -> float:
    """The most the active run can still cost from `t`."""
    if run.state == RunState.retained:
        left = run.state_changed_at + timedelta(seconds=limits.retention_limit_s) - t
        return run.offer.disk_per_hour * max(0.0, left.total_seconds()) / 3600
    by = run.deadlines.runtime_by or ((run.launched_at or t) + timedelta(seconds=run.runtime_limit_s))
    return hourly_price(run) * max(0.0, (by - t).total_seconds()) / 3600


def expected_remaining(run: RunRecord, t: datetime) -> float:
    """The forecast's share: until the run's forecast end (capped by its runtime limit)."""
    if run.state == RunState.retained or run.forecast is None or run.launched_at is None:
        return 0.0
    by = run.launched_at + timedelta(seconds=min(run.forecast.total_s, run.runtime_limit_s))
    return hourly_price(run) * max(0.0, (by - t).total_seconds()) / 3600


@dataclass
class Spend:
    billed: float = 0.0
    held: float = 0.0  # the most the active runs and the launches under way can still cost
    expected: float = 0.0  # what the active runs are forecast to cost still

    @property
    def committed(self) -> float:
        return self.billed + self.held


@dataclass
class OrgSpend:
    month: str
    org: Spend = field(default_factory=Spend)
    projects: dict[str, Spend] = field(default_factory=dict)

    def of(self, project: str | None) -> Spend:
        return self.org if project is None else self.projects.setdefault(project, Spend())


def spend(ctx: Context, org: str, t: datetime, limits: OrgLimits, reservations: dict[str, Any] | None = None) -> OrgSpend:
    """The org's spend this month, in total and per project; `reservations`: launches under way."""
    out = OrgSpend(month=month_of(t))
    store = ctx.store
    runs = store.runs.in_org(org)
    active = {r.id for r in runs if r.state in HOLDS_MACHINE}
    for run in runs:
        billed = billed_in_month(ctx, run, t)
        held = max_remaining(run, t, limits) if run.id in active else 0.0
        expected = expected_remaining(run, t) if run.id in active else 0.0
        for s in (out.org, out.of(run.project_id)):
            s.billed += billed
            s.held += held
            s.expected += expected
    drafts = {r.id: r for r in runs if r.state == RunState.draft}
    for run_id, res in (reservations or {}).items():
        if run_id in drafts and left(ends(float(res.get("at", 0)), LAUNCH_GRACE_S)) > 0:
            for s in (out.org, out.of(str(res.get("project", "")))):
                s.held += float(res.get("cost", 0.0))
    return out


def _budgets(limits: OrgLimits, project: str) -> list[tuple[str, float, str | None]]:
    """(name, USD, project or None) of each budget a run of `project` counts against."""
    found: list[tuple[str, float, str | None]] = []
    if limits.monthly_budget_usd is not None:
        found.append(("the organization's monthly budget", limits.monthly_budget_usd, None))
    if project in limits.project_budgets_usd:
        found.append((f"project {project}'s monthly budget", limits.project_budgets_usd[project], project))
    return found


def reserve(ctx: Context, org: str, run: RunRecord, cost: float, limits: OrgLimits) -> bool:
    """Take `cost` (the launch's maximum) from the run's budgets, or raise 409 naming the budget, the committed
    spend and what is left. Returns whether this call wrote a reservation (False: no budget applies, or the run
    holds one already)."""
    budgets = _budgets(limits, run.project_id)
    if not budgets:
        return False
    table = ctx.store.table("quotas")
    for attempt in range(MAX_RACE_RETRIES):
        got = table.get(org, RESERVATIONS_KEY)
        held: dict[str, Any] = dict(got[0].get("runs", {})) if got else {}
        if run.id in held:
            return False
        t = now()
        s = spend(ctx, org, t, limits, held)
        for name, usd, project in budgets:
            committed = s.of(project).committed
            if committed + cost > usd + 1e-9:
                raise Conflict(
                    f"nothing was launched: this run may cost up to {cost:.2f} USD (its price x its runtime limit), "
                    f"and {name} of {usd:.2f} USD has {committed:.2f} USD committed this month (billed plus the most "
                    f"the active runs can still cost), so {max(0.0, usd - committed):.2f} USD is left; lower the "
                    "runtime limit or choose a cheaper offer, wait for runs to end, or an owner raises the budget "
                    "under /api/org/limits")
        # Reservations of runs no longer launching go with this write.
        keep = {k: v for k, v in held.items() if left(ends(float(v.get("at", 0)), LAUNCH_GRACE_S)) > 0}
        keep[run.id] = {"cost": round(cost, 6), "at": now_ts(), "project": run.project_id}
        try:
            if got is None:
                table.insert(org, RESERVATIONS_KEY, {"runs": keep})
            else:
                table.update(org, RESERVATIONS_KEY, {"runs": keep}, got[1])
            return True
        except (ConcurrencyError, Conflict):
            time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
    raise ConcurrencyError("the organization's launches kept changing; try again")


def release(ctx: Context, org: str, run_id: str) -> None:
    """Free a failed launch's reservation (its run did not launch)."""
    table = ctx.store.table("quotas")
    for _ in range(MAX_RACE_RETRIES):
        got = table.get(org, RESERVATIONS_KEY)
        held = dict(got[0].get("runs", {})) if got else {}
        if got is None or run_id not in held:
            return
        del held[run_id]
        try:
            table.update(org, RESERVATIONS_KEY, {"runs": held}, got[1])
            return
        except ConcurrencyError:
            continue


def alerts_key(t: datetime) -> str:
    return f"budget-alerts-{month_of(t)}"


def view(ctx: Context, org: str, t: datetime | None = None) -> dict[str, Any]:
    """The budgets part of GET /api/usage."""
    t = t or now()
    limits = get_limits(ctx, org)
    got = ctx.store.table("quotas").get(org, RESERVATIONS_KEY)
    s = spend(ctx, org, t, limits, dict(got[0].get("runs", {})) if got else {})
    alerts = ctx.store.table("quotas").get(org, alerts_key(t))
    crossed: dict[str, list[int]] = dict(alerts[0].get("crossed", {})) if alerts else {}

    def one(name: str, usd: float | None, sp: Spend, key: str) -> dict[str, Any]:
        return {"name": name, "budget_usd": usd, "billed_usd": round(sp.billed, 4), "held_usd": round(sp.held, 4),
                "committed_usd": round(sp.committed, 4),
                "left_usd": None if usd is None else round(max(0.0, usd - sp.committed), 4),
                "forecast_usd": round(sp.billed + sp.expected, 4),
                "thresholds_pct": list(limits.budget_thresholds_pct), "crossed_pct": crossed.get(key, [])}

    items = [one("organization", limits.monthly_budget_usd, s.org, "org")]
    for project, usd in sorted(limits.project_budgets_usd.items()):
        items.append(one(f"project {project}", usd, s.of(project), f"project:{project}") | {"project_id": project})
    return {"month": month_of(t), "stop_at_budget": limits.stop_at_budget, "budgets": items}


def _budgets_of(limits: OrgLimits) -> list[tuple[str, float, str | None]]:
    """The org's budgets: (its key, its USD, its project or None for the org's)."""
    budgets: list[tuple[str, float, str | None]] = []
    if limits.monthly_budget_usd is not None:
        budgets.append(("org", limits.monthly_budget_usd, None))
    return budgets + [(f"project:{p}", usd, p) for p, usd in sorted(limits.project_budgets_usd.items())]


def _crossings(ctx: Context, org: str, t: datetime, budget: tuple[str, float, str | None], s: OrgSpend, limits: OrgLimits,
               crossed: dict[str, list[int]]) -> tuple[int, bool]:
    """The budget's thresholds its billed spend crosses for the first time this month, each told and added to
    `crossed`: how many, and whether the whole budget is spent."""
    bkey, usd, project = budget
    pct = 100.0 * s.of(project).billed / usd if usd > 0 else 100.0
    new = 0
    for threshold in sorted(limits.budget_thresholds_pct):
        if pct >= threshold and threshold not in crossed.get(bkey, []):
            _tell_crossing(ctx, org, t, budget, threshold, s)
            crossed.setdefault(bkey, []).append(threshold)
            new += 1
    return new, pct >= 100


def _tell_crossing(ctx: Context, org: str, t: datetime, budget: tuple[str, float, str | None], threshold: int,
                   s: OrgSpend) -> None:
    """A new threshold crossing, as the budget.threshold event (its webhooks) and an audit entry."""
    bkey, usd, project = budget
    billed = s.of(project).billed
    ident = f"msg_budget-{month_of(t)}-{bkey.replace(':', '-')}-{threshold}"[:68]
    send_event(ctx, org, "budget.threshold", ident, {
        "budget": "organization" if project is None else f"project {project}", "project_id": project,
        "month": month_of(t), "threshold_pct": threshold, "budget_usd": usd,
        "billed_usd": round(billed, 4), "committed_usd": round(s.of(project).committed, 4)})
    ctx.store.audit.add("budget threshold crossed", org=org, budget=bkey, threshold_pct=threshold,
                        billed_usd=round(billed, 4), budget_usd=usd)


def check_thresholds(ctx: Context, org: str, t: datetime) -> int:
    """heartbeat-check, for an org with active runs: record and tell new threshold crossings (of billed spend);
    at 100 % with stop_at_budget, retain the org's active runs. Returns the crossings found."""
    limits = get_limits(ctx, org)
    if limits.monthly_budget_usd is None and not limits.project_budgets_usd:
        return 0
    table = ctx.store.table("quotas")
    key = alerts_key(t)
    got = table.get(org, key)
    state: dict[str, Any] = dict(got[0]) if got else {"crossed": {}, "checked": 0.0}
    if t.timestamp() - float(state.get("checked", 0.0)) < CHECK_EVERY_S:
        return 0
    s = spend(ctx, org, t, limits)
    crossed: dict[str, list[int]] = {k: list(v) for k, v in state.get("crossed", {}).items()}
    new = 0
    stop: list[str | None] = []
    for budget in _budgets_of(limits):
        found, spent = _crossings(ctx, org, t, budget, s, limits, crossed)
        new += found
        if spent and limits.stop_at_budget:
            stop.append(budget[2])
    state = {"crossed": crossed, "checked": t.timestamp()}
    try:
        if got is None:
            table.insert(org, key, state)
        else:
            table.update(org, key, state, got[1])
    except (ConcurrencyError, Conflict):
        return 0  # another tick recorded it
    if stop:
        _retain_active(ctx, org, stop)
    return new


def _retain_active(ctx: Context, org: str, projects: list[str | None]) -> None:
    whole = None in projects
    for run in ctx.store.runs.active(org):
        if run.state not in ACTIVE or not (whole or run.project_id in projects):
            continue

        def change(r: RunRecord) -> RunRecord | None:
            if r.state not in ACTIVE:
                return None
            return transition(r, RunState.retaining, reason="the monthly budget was reached (stop_at_budget): the "
                              "machine is stopped and its disk kept; recover the run once the budget allows")

        try:
            _, wrote = move_stored(ctx, org, run.id, change)
        except NotFound:
            continue
        if wrote:
            ctx.queues.send(Step.retain, StepMessage(org=org, run_id=run.id, reason="budget"))
