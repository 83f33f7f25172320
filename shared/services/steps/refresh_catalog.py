"""The refresh-catalog step: fetch a connection's GPU offers and cache them with their time.

A refresh that fails records the error and keeps the previous offers (a price source outage must
not block launches). Sent when the API finds a catalog stale, and hourly by the timer
(shared/services/timers/refresh_catalogs.py).
"""

from __future__ import annotations

from shared.clock import now
from shared.context import Context
from shared.errors import ProviderError
from shared.log import get_logger
from shared.models import CatalogRecord, ConnectionMessage
from shared.runs.org_backends import compute_for, connection_of_slot, provider_of
from shared.services.steps.validate_connection import offers_of


def refresh(ctx: Context, org: str, connection: str) -> CatalogRecord:
    """Refresh the catalog of the compute connection `connection` (`aws`, `aws/us-west-2`)."""
    store, provider = ctx.store, provider_of(connection)
    previous = store.catalogs.get(org, connection)
    try:
        offers = offers_of(connection, compute_for(ctx, org, connection).offers())
        rec = CatalogRecord(org=org, provider=provider, connection=connection, offers=offers, fetched_at=now())
    except ProviderError as exc:
        get_logger().warning("catalog refresh failed; serving the last good copy", extra={"connection": connection})
        rec = CatalogRecord(org=org, provider=provider, connection=connection,
                            offers=previous.offers if previous else [],
                            fetched_at=previous.fetched_at if previous else None,
                            last_error=exc.reason, last_error_at=now())
    store.catalogs.put(rec)
    return rec


def refresh_catalog(ctx: Context, msg: ConnectionMessage) -> None:
    refresh(ctx, msg.org, connection_of_slot(msg.slot))
