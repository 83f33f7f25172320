"""deliver-webhook: one attempt of one event to one endpoint.

Idempotent: an event the endpoint has accepted (2xx) once is marked delivered and never sent again; a
failed attempt sends this same message to itself (same webhook-id, same body) with the next delay of
RETRY_DELAYS_S through the queue's visibility, so no invocation waits, and after the last one the message
goes to the poison queue, where an admin can replay it (GET/POST /api/platform/queues/deliver-webhook/poison).
An endpoint whose deliveries have failed for DISABLE_AFTER_S is disabled, with an audit event and a notice
in its view; an owner enables it again (PATCH enabled: true).
"""

from __future__ import annotations

from datetime import timedelta

from shared.clock import now
from shared.context import Context
from shared.errors import NotFound
from shared.log import get_logger, register_secret
from shared.queues import encode
from shared.security import unseal
from shared.steps import Step
from shared.webhooks import store
from shared.webhooks.models import DeliveryAttempt, DeliveryMessage, EndpointRecord
from shared.webhooks.send import post

RETRY_DELAYS_S = (5, 5 * 60, 30 * 60, 2 * 3600, 5 * 3600, 10 * 3600)
DISABLE_AFTER_S = 5 * 24 * 3600


def secret_aad(org: str, endpoint_id: str) -> str:
    return f"{org}|webhook:{endpoint_id}"


def signing_secrets(ep: EndpointRecord) -> list[str]:
    """The secrets that sign now: the current one, and the previous one during a rotation's grace."""
    aad = secret_aad(ep.org, ep.id)
    out = [str(unseal(ep.secret, aad=aad)["value"])]
    if ep.previous_secret and ep.previous_until and now() < ep.previous_until:
        out.append(str(unseal(ep.previous_secret, aad=aad)["value"]))
    for s in out:
        register_secret(s)
    return out


def deliver_webhook(ctx: Context, msg: DeliveryMessage) -> None:
    log = get_logger()
    try:
        ep, _ = store.get(ctx, msg.org, msg.endpoint_id)
    except NotFound:
        log.info("webhook endpoint deleted; delivery dropped")
        return

    def record(outcome: str, code: int | None = None, error: str = "", ms: int = 0) -> None:
        store.log(ctx, msg.org, ep.id, DeliveryAttempt(at=now(), webhook_id=msg.webhook_id, type=msg.type,
                                                       attempt=msg.attempt + 1, outcome=outcome,  # type: ignore[arg-type]
                                                       status_code=code, error=error[:300], duration_ms=ms))

    if store.delivered(ctx, msg.org, ep.id, msg.webhook_id):
        return  # a duplicate of a delivered event
    if not ep.enabled:
        record("skipped", error="the endpoint is disabled")
        return
    result = post(ep.url, msg.webhook_id, msg.body, signing_secrets(ep))
    if result.ok:
        store.mark_delivered(ctx, msg.org, ep.id, msg.webhook_id)
        record("delivered", result.status_code, ms=result.duration_ms)
        t = now()
        store.mutate(ctx, msg.org, ep.id, lambda e: e.model_copy(update={"failing_since": None, "last_success_at": t}))
        return
    last = msg.attempt >= len(RETRY_DELAYS_S)
    record("failed" if last else "retrying", result.status_code, result.error, result.duration_ms)
    _note_failure(ctx, ep)
    if last:
        ctx.queues.client(Step.deliver_webhook.poison).send_message(_encoded(msg))
        log.warning("webhook delivery failed its last retry; moved to poison", extra={"webhook_id": msg.webhook_id})
        return
    ctx.queues.send(Step.deliver_webhook, msg.model_copy(update={"attempt": msg.attempt + 1}),
                    delay_s=RETRY_DELAYS_S[msg.attempt])


def _encoded(msg: DeliveryMessage) -> str:
    return encode(msg)


def _note_failure(ctx: Context, ep: EndpointRecord) -> None:
    t = now()

    def change(e: EndpointRecord) -> EndpointRecord | None:
        since = e.failing_since or t
        if e.enabled and t - since >= timedelta(seconds=DISABLE_AFTER_S):
            return e.model_copy(update={
                "failing_since": since, "enabled": False, "disabled_at": t,
                "disabled_reason": (f"disabled on {t:%Y-%m-%d %H:%M} UTC: every delivery since "
                                    f"{since:%Y-%m-%d %H:%M} UTC failed; fix the receiver, then enable it again")})
        return None if e.failing_since else e.model_copy(update={"failing_since": t})

    new = store.mutate(ctx, ep.org, ep.id, change)
    if ep.enabled and not new.enabled:
        ctx.store.audit.add("webhook disabled", org=ep.org, endpoint=ep.id, reason=new.disabled_reason)
