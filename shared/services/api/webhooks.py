"""An organization's webhook endpoints (/api/org/webhooks): owners create, change, rotate, test and delete
them; members may read them and their delivery log. At most MAX_ENDPOINTS per org.

The signing secret (`whsec_` + 32 random bytes, base64) is sealed at rest with "<org>|webhook:<id>" as the
associated data and returned once, at creation and at rotation; a rotation keeps the previous secret
signing beside the new one for ROTATION_GRACE_S, so receivers can switch without losing an event. The URL
passes the custom S3 endpoints' guard at creation and at every delivery (shared/webhooks/send.py).
"""

from __future__ import annotations

import base64
import os
import secrets as pysecrets
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from shared.clock import now
from shared.context import Context
from shared.errors import Conflict, InvalidInput, invalid
from shared.log import register_secret
from shared.models import Role
from shared.org_storage.endpoint_guard import EndpointRefused
from shared.outside_events import TEST_EVENT
from shared.runs.outbox import new_webhook_id
from shared.security import Principal, require, seal
from shared.services.steps.deliver_webhook import secret_aad
from shared.steps import Step
from shared.webhooks import store
from shared.webhooks.models import (
    MAX_ENDPOINTS,
    DeliveryAttempt,
    DeliveryMessage,
    EndpointRecord,
    WebhookCreate,
    WebhookPatch,
    WebhookSecret,
    WebhookView,
)
from shared.webhooks.send import check_url

ROTATION_GRACE_S = 24 * 3600


def _view(ep: EndpointRecord) -> WebhookView:
    grace = ep.previous_until if ep.previous_secret and ep.previous_until and now() < ep.previous_until else None
    return WebhookView(id=ep.id, url=ep.url, types=ep.types, enabled=ep.enabled, description=ep.description,
                       created_at=ep.created_at, rotated_at=ep.rotated_at, previous_secret_valid_until=grace,
                       failing_since=ep.failing_since, last_success_at=ep.last_success_at,
                       notice=ep.disabled_reason if not ep.enabled else "")


def _new_secret() -> str:
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    register_secret(secret)  # masked in any log line from here on
    return secret


def _checked_url(url: str) -> str:
    try:
        check_url(url)
    except EndpointRefused as exc:
        raise InvalidInput.field("url", f"{exc}: a webhook URL must be https:// on a public address "
                                 "(private, loopback and link-local addresses are refused)") from exc
    return url


def _parse(model: Any, body: Any) -> Any:
    if not isinstance(body, dict):
        raise InvalidInput.field("body", "send a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise invalid(exc) from exc


def create(ctx: Context, principal: Principal, body: Any) -> WebhookSecret:
    require(principal, Role.owner)
    req: WebhookCreate = _parse(WebhookCreate, body)
    if len(store.endpoints(ctx, principal.org)) >= MAX_ENDPOINTS:
        raise Conflict(f"the organization has {MAX_ENDPOINTS} webhooks, the most it may have; delete one first")
    _checked_url(req.url)
    endpoint_id = "wh-" + pysecrets.token_hex(6)
    secret = _new_secret()
    ep = EndpointRecord(org=principal.org, id=endpoint_id, url=req.url, types=req.types, enabled=req.enabled,
                        description=req.description, secret=seal({"value": secret}, aad=secret_aad(principal.org, endpoint_id)),
                        created_at=now(), created_by=principal.sub)
    store.insert(ctx, ep)
    return WebhookSecret(**_view(ep).model_dump(), secret=secret)


def list_all(ctx: Context, principal: Principal) -> dict[str, Any]:
    require(principal, Role.owner, Role.member)
    return {"items": [_view(e) for e in store.endpoints(ctx, principal.org)], "limit": MAX_ENDPOINTS}


def show(ctx: Context, principal: Principal, endpoint_id: str) -> WebhookView:
    require(principal, Role.owner, Role.member)
    return _view(store.get(ctx, principal.org, endpoint_id)[0])


def patch(ctx: Context, principal: Principal, endpoint_id: str, body: Any) -> WebhookView:
    require(principal, Role.owner)
    req: WebhookPatch = _parse(WebhookPatch, body)
    if req.url is not None:
        _checked_url(req.url)
    fields = req.model_dump(exclude_unset=True)

    def change(e: EndpointRecord) -> EndpointRecord:
        update = {k: v for k, v in fields.items() if v is not None}
        if update.get("enabled") and not e.enabled:  # enabled again: the failure count starts over
            update |= {"failing_since": None, "disabled_at": None, "disabled_reason": ""}
        return e.model_copy(update=update)

    return _view(store.mutate(ctx, principal.org, endpoint_id, change))


def rotate(ctx: Context, principal: Principal, endpoint_id: str) -> WebhookSecret:
    require(principal, Role.owner)
    secret = _new_secret()
    t = now()
    aad = secret_aad(principal.org, endpoint_id)
    sealed = seal({"value": secret}, aad=aad)

    def change(e: EndpointRecord) -> EndpointRecord:
        return e.model_copy(update={"secret": sealed, "previous_secret": e.secret, "rotated_at": t,
                                    "previous_until": t + timedelta(seconds=ROTATION_GRACE_S)})

    ep = store.mutate(ctx, principal.org, endpoint_id, change)
    return WebhookSecret(**_view(ep).model_dump(), secret=secret)


def delete(ctx: Context, principal: Principal, endpoint_id: str) -> None:
    require(principal, Role.owner)
    store.delete(ctx, principal.org, endpoint_id)


def test(ctx: Context, principal: Principal, endpoint_id: str) -> dict[str, Any]:
    """Queue a webhook.test event to this endpoint (whatever types it subscribes to)."""
    require(principal, Role.owner)
    ep, _ = store.get(ctx, principal.org, endpoint_id)
    import json

    webhook_id = new_webhook_id()
    body = json.dumps({"type": TEST_EVENT, "timestamp": now().isoformat(),
                       "data": {"org": principal.org, "webhook_id": ep.id}}, separators=(",", ":"))
    ctx.queues.send(Step.deliver_webhook, DeliveryMessage(org=principal.org, endpoint_id=ep.id,
                                                          webhook_id=webhook_id, type=TEST_EVENT, body=body))
    return {"queued": True, "webhook_id": webhook_id, "type": TEST_EVENT}


def deliveries(ctx: Context, principal: Principal, endpoint_id: str) -> dict[str, list[DeliveryAttempt]]:
    require(principal, Role.owner, Role.member)
    store.get(ctx, principal.org, endpoint_id)  # 404 for another org's or a deleted endpoint
    return {"items": store.attempts(ctx, principal.org, endpoint_id)}
