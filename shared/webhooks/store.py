"""The `webhooks` table: an org's endpoints (PartitionKey org, RowKey endpoint id), each delivery's state
(PartitionKey `<org>~msg`, RowKey `<endpoint>~<webhook id>`: a second delivery of a delivered event does
nothing) and the attempt log (PartitionKey `<org>~log~<endpoint>`, newest first, so the last 100 are one
query)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from shared.clock import now_ts
from shared.errors import ConcurrencyError, NotFound
from shared.store.keys import org_key
from shared.store.tables import MAX_RACE_RETRIES, Table
from shared.webhooks.models import ENDPOINT_ID_PATTERN, DeliveryAttempt, EndpointRecord

# For typing only: shared.context imports the queues, whose step messages are shared.webhooks' (a package cycle).
if TYPE_CHECKING:
    from shared.context import Context

_ENDPOINT = re.compile(ENDPOINT_ID_PATTERN)
LOG_KEPT = 100


def table(ctx: Context) -> Table:
    return ctx.store.table("webhooks")


def _ep_key(endpoint_id: str) -> str:
    if not isinstance(endpoint_id, str) or not _ENDPOINT.fullmatch(endpoint_id):
        raise NotFound(f"webhook {endpoint_id!r:.40} not found")
    return endpoint_id


def endpoints(ctx: Context, org: str) -> list[EndpointRecord]:
    q = table(ctx).query("PartitionKey eq @org", org=org_key(org), top=50)
    return [EndpointRecord.model_validate(d) for d, _ in q]


def get(ctx: Context, org: str, endpoint_id: str) -> tuple[EndpointRecord, str]:
    got = table(ctx).get(org_key(org), _ep_key(endpoint_id))
    if got is None:
        raise NotFound(f"webhook {endpoint_id} not found")
    return EndpointRecord.model_validate(got[0]), got[1]


def insert(ctx: Context, rec: EndpointRecord) -> None:
    table(ctx).insert(org_key(rec.org), rec.id, rec.model_dump(mode="json"))


def mutate(ctx: Context, org: str, endpoint_id: str, change: Callable[[EndpointRecord], EndpointRecord | None]) -> EndpointRecord:
    """Read-decide-write with the ETag; `change` returns None to leave it."""
    for _ in range(MAX_RACE_RETRIES):
        rec, etag = get(ctx, org, endpoint_id)
        new = change(rec)
        if new is None:
            return rec
        try:
            table(ctx).update(org_key(org), endpoint_id, new.model_dump(mode="json"), etag)
            return new
        except ConcurrencyError:
            continue
    raise ConcurrencyError(f"webhook {endpoint_id} kept changing; try again")


def delete(ctx: Context, org: str, endpoint_id: str) -> None:
    from azure.core.exceptions import ResourceNotFoundError

    try:
        table(ctx).delete(org_key(org), _ep_key(endpoint_id))
    except ResourceNotFoundError as exc:
        raise NotFound(f"webhook {endpoint_id} not found") from exc


def delivered(ctx: Context, org: str, endpoint_id: str, webhook_id: str) -> bool:
    got = table(ctx).get(f"{org_key(org)}~msg", f"{endpoint_id}~{webhook_id}")
    return bool(got and got[0].get("delivered"))


def mark_delivered(ctx: Context, org: str, endpoint_id: str, webhook_id: str) -> None:
    table(ctx).upsert(f"{org_key(org)}~msg", f"{endpoint_id}~{webhook_id}", {"delivered": True, "at": now_ts()})


def _descending() -> str:
    return f"{10**20 - 1 - int(now_ts() * 1_000_000):020d}"


def log(ctx: Context, org: str, endpoint_id: str, attempt: DeliveryAttempt) -> None:
    import secrets

    table(ctx).upsert(f"{org_key(org)}~log~{endpoint_id}", f"{_descending()}-{secrets.token_hex(3)}",
                   attempt.model_dump(mode="json"))


def attempts(ctx: Context, org: str, endpoint_id: str, limit: int = LOG_KEPT) -> list[DeliveryAttempt]:
    """The endpoint's last `limit` attempts, newest first (one query)."""
    q = table(ctx).query("PartitionKey eq @p", top=limit, p=f"{org_key(org)}~log~{_ep_key(endpoint_id)}")
    return [DeliveryAttempt.model_validate(d) for d, _ in q]
