"""Webhook endpoints, their bodies and views, and the deliver-webhook message."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator

from shared.models import ORG_PATTERN, Model
from shared.outside_events import TEST_EVENT, TYPES

MAX_ENDPOINTS = 10  # per organization
ENDPOINT_ID_PATTERN = r"^wh-[0-9a-f]{12}$"
WEBHOOK_ID_PATTERN = r"^msg_[A-Za-z0-9_-]{8,64}$"
URL_RULES: dict[str, object] = {
    "min_length": 9, "max_length": 2000, "pattern": r"^https?://[^\s]+$",
    "description": "https:// URL on a public address (private, loopback and link-local are refused)"}


def _types(v: list[str] | None) -> list[str] | None:
    if v is None:
        return v
    unknown = sorted(set(v) - set(TYPES))
    if unknown:
        raise ValueError(f"unknown event types {unknown}; known: {', '.join(TYPES)}")
    return sorted(set(v))


class WebhookCreate(Model):
    url: str = Field(**URL_RULES)  # type: ignore[call-overload]
    types: list[str] = Field(default_factory=lambda: list(TYPES), min_length=1, max_length=len(TYPES),
                             description="event types to send (default: all)")
    enabled: bool = True
    description: str = Field(default="", max_length=200)

    _check_types = field_validator("types")(_types)


class WebhookPatch(Model):
    url: str | None = Field(default=None, **URL_RULES)  # type: ignore[call-overload]
    types: list[str] | None = Field(default=None, min_length=1, max_length=len(TYPES))
    enabled: bool | None = Field(default=None, description="true re-enables an endpoint disabled for failing")
    description: str | None = Field(default=None, max_length=200)

    _check_types = field_validator("types")(_types)


class EndpointRecord(Model):
    org: str
    id: str
    url: str
    types: list[str]
    enabled: bool = True
    description: str = ""
    secret: str  # sealed (shared.security.seal): never returned, never logged
    previous_secret: str = ""  # sealed; still signs until previous_until (a rotation's 24 h)
    previous_until: datetime | None = None
    created_at: datetime
    created_by: str = ""
    rotated_at: datetime | None = None
    failing_since: datetime | None = None  # first failed attempt since the last success
    last_success_at: datetime | None = None
    disabled_at: datetime | None = None
    disabled_reason: str = ""


class WebhookView(Model):
    id: str
    url: str
    types: list[str]
    enabled: bool
    description: str
    created_at: datetime
    rotated_at: datetime | None = None
    previous_secret_valid_until: datetime | None = None
    failing_since: datetime | None = None
    last_success_at: datetime | None = None
    # Why it was disabled (5 days of failed deliveries), shown until an owner enables it again.
    notice: str = ""


class WebhookSecret(WebhookView):
    """The view with its signing secret: returned once, at creation and at rotation."""

    secret: str


class DeliveryAttempt(Model):
    at: datetime
    webhook_id: str
    type: str
    attempt: int
    outcome: Literal["delivered", "retrying", "failed", "skipped"]
    status_code: int | None = None
    error: str = ""
    duration_ms: int = 0


class DeliveryMessage(Model):
    """One delivery of one event to one endpoint; its retries carry the same webhook_id and body."""

    v: Literal[1] = 1
    org: str = Field(pattern=ORG_PATTERN)
    endpoint_id: str = Field(pattern=ENDPOINT_ID_PATTERN)
    webhook_id: str = Field(pattern=WEBHOOK_ID_PATTERN)
    type: str = Field(max_length=64)
    body: str = Field(max_length=16_000)
    attempt: int = Field(default=0, ge=0, le=100)
    subject: str = Field(default="", pattern=r"^(|[A-Za-z0-9][A-Za-z0-9._-]{0,127})$")  # the run's id (logs only)

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in TYPES and v != TEST_EVENT:
            raise ValueError(f"unknown event type {v!r}")
        return v
