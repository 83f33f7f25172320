"""An organization's limits (PUT /api/org/limits: shared/services/api/quotas.py) and their one read.

Here, in the run domain, because a timer reads them too: heartbeat-check holds each retained run to
its org's retention limit (shared/runs/retention.py), and a timer imports no API module.
"""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.context import Context

LIMITS_KEY = "limits"
DAY_S = 24 * 3600


class OrgLimits(BaseModel):
    """What an owner may set; the defaults hold until then."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_active_runs: int = Field(default=5, ge=1, le=1000,
                                 description="launched runs not finished yet (holding a machine or disk)")
    max_price_limit_per_hour: float = Field(default=100.0, gt=0, le=1000,
                                            description="highest price_limit_per_hour a run may have")
    max_runtime_limit_s: int = Field(default=24 * 3600, ge=60, le=7 * 24 * 3600,
                                     description="highest runtime_limit_s a run may have")
    runs_per_minute: int = Field(default=10, ge=1, le=1000,
                                 description="run creations (and, separately, launches) per minute")
    retention_limit_s: int = Field(default=14 * DAY_S, ge=DAY_S, le=365 * DAY_S, description=(
        "how long a retained run keeps its stopped machine and disk (billed as disk) without a recovery: "
        "the owner is warned by an event 2 days before (half-way for a limit under 4 days), and at the limit "
        "the run is discarded (machine and disk released, the run failed). Counted from when the run was last "
        "retained"))
    max_capacity_wait_s: int = Field(default=6 * 3600, ge=0, le=7 * 24 * 3600, description=(
        "highest capacity_wait_s a run may have: how long it may keep trying its candidates again when every one "
        "refused for capacity, quota or stock (nothing bills while it waits)"))
    # Budgets (shared/runs/budgets.py): USD per calendar month (UTC); None: no budget.
    monthly_budget_usd: float | None = Field(default=None, ge=0, le=10_000_000, description=(
        "the organization's monthly budget in USD: a launch whose maximum cost would take committed spend (billed "
        "this month + the most the active runs can still cost) over it is refused"))
    project_budgets_usd: dict[str, float] = Field(default_factory=dict, max_length=100, description=(
        "monthly budgets in USD per project id, held like the organization's"))
    budget_thresholds_pct: list[int] = Field(default_factory=lambda: [50, 80, 100], min_length=1, max_length=10,
                                             description="billed spend, in % of a budget, that is announced "
                                             "(an audit line and a budget.threshold webhook)")
    stop_at_budget: bool = Field(default=False, description=(
        "at 100 % of a budget, retain its active runs (machine stopped, disk kept, recoverable)"))

    @field_validator("project_budgets_usd")
    @classmethod
    def _projects(cls, v: dict[str, float]) -> dict[str, float]:
        for project, usd in v.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", project):
                raise ValueError(f"{project!r:.40} is not a project id")
            if not 0 <= usd <= 10_000_000:
                raise ValueError(f"project {project}: the budget must be between 0 and 10000000 USD")
        return v

    @field_validator("budget_thresholds_pct")
    @classmethod
    def _thresholds(cls, v: list[int]) -> list[int]:
        if any(not 1 <= x <= 100 for x in v):
            raise ValueError("each threshold is a percentage from 1 to 100")
        return sorted(set(v))


# Each limit's operator ceiling: the Settings field and its app setting's name.
CEILINGS = {
    "max_active_runs": ("org_max_active_runs_ceiling", "TENSORANT_ORG_MAX_ACTIVE_RUNS_CEILING"),
    "runs_per_minute": ("org_runs_per_minute_ceiling", "TENSORANT_ORG_RUNS_PER_MINUTE_CEILING"),
    "max_price_limit_per_hour": ("org_max_price_ceiling", "TENSORANT_ORG_MAX_PRICE_CEILING"),
    "max_runtime_limit_s": ("org_max_runtime_ceiling_s", "TENSORANT_ORG_MAX_RUNTIME_CEILING_S"),
    "retention_limit_s": ("org_retention_ceiling_s", "TENSORANT_ORG_RETENTION_CEILING_S"),
    "max_capacity_wait_s": ("org_max_capacity_wait_ceiling_s", "TENSORANT_ORG_MAX_CAPACITY_WAIT_CEILING_S"),
}


def ceiling(ctx: Context, field: str) -> float:
    return float(getattr(ctx.settings, CEILINGS[field][0]))


def over_ceilings(ctx: Context, values: dict[str, object]) -> list[dict[str, str]]:
    """The problem+json errors of the values an owner asks for that pass the deployment's ceilings."""
    errors = []
    for field, (_, env) in CEILINGS.items():
        value = values.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > ceiling(ctx, field):
            errors.append({"field": field, "message": (
                f"{value:g} is above this deployment's ceiling of {ceiling(ctx, field):g}; ask for at most that (the "
                f"operator sets the ceiling with {env})")})
    return errors


def capped(ctx: Context, limits: OrgLimits) -> OrgLimits:
    """The limits in force: each at most its ceiling (a ceiling lowered after an owner set a higher
    value binds at once; so does one below a default)."""
    update = {}
    for field in CEILINGS:
        top = ceiling(ctx, field)
        if getattr(limits, field) > top:
            update[field] = type(getattr(limits, field))(top)
    return limits.model_copy(update=update) if update else limits


class RetentionAffected(BaseModel):
    """A retained run that a lowered retention limit brings forward: warned first, never discarded at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    retained_since: datetime
    discard_at: datetime = Field(description="the earliest discard under the new limit: the limit after the run "
                                             "was retained, and at least the warning's interval after its warning")


class LimitsAnswer(OrgLimits):
    """PUT /api/org/limits's answer: the limits saved, and the retained runs whose discard they bring forward."""

    retention_affects: list[RetentionAffected] = Field(default_factory=list, description=(
        "the retained runs whose discard the new retention_limit_s brings forward; each is warned by an event "
        "first and discarded no earlier than its discard_at"))


def get_limits(ctx: Context, org: str) -> OrgLimits:
    got = ctx.store.table("quotas").get(org, LIMITS_KEY)
    return capped(ctx, OrgLimits.model_validate(got[0]) if got else OrgLimits())


def set_limits(ctx: Context, org: str, limits: OrgLimits) -> OrgLimits:
    ctx.store.table("quotas").upsert(org, LIMITS_KEY, limits.model_dump(mode="json"))
    return limits
