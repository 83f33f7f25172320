"""An organization's limits (PUT /api/org/limits: shared/services/api/quotas.py) and their one read.

Here, in the run domain, because a timer reads them too: heartbeat-check holds each retained run to
its org's retention limit (shared/runs/retention.py), and a timer imports no API module.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shared.store import get_store

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


def get_limits(org: str) -> OrgLimits:
    got = get_store().table("quotas").get(org, LIMITS_KEY)
    return OrgLimits.model_validate(got[0]) if got else OrgLimits()


def set_limits(org: str, limits: OrgLimits) -> OrgLimits:
    get_store().table("quotas").upsert(org, LIMITS_KEY, limits.model_dump(mode="json"))
    return limits
