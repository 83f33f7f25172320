"""The refresh-catalog step: fetch a connection's GPU offers and cache them with their time.

A refresh that fails records the error and keeps the previous offers (a price source outage must
not block launches). Sent when the API finds a catalog stale, and hourly by the timer
(shared/services/timers/refresh_catalogs.py).
"""

from __future__ import annotations

from shared.clock import now
from shared.errors import ProviderError
from shared.log import get_logger
from shared.models import CatalogRecord, ConnectionMessage
from shared.runs.org_backends import compute_for
from shared.store import get_store


def refresh(org: str, provider: str) -> CatalogRecord:
    store = get_store()
    previous = store.catalogs.get(org, provider)
    try:
        offers = compute_for(org, provider).offers()
        rec = CatalogRecord(org=org, provider=provider, offers=offers, fetched_at=now())
    except ProviderError as exc:
        get_logger().warning("catalog refresh failed; serving the last good copy", extra={"provider": provider})
        rec = CatalogRecord(org=org, provider=provider, offers=previous.offers if previous else [],
                            fetched_at=previous.fetched_at if previous else None,
                            last_error=exc.reason, last_error_at=now())
    store.catalogs.put(rec)
    return rec


def refresh_catalog(msg: ConnectionMessage) -> None:
    refresh(msg.org, msg.slot.removeprefix("compute:"))
