"""The validate-connection step: run a saved connection's checks (credentials, permissions, the
machines runs hold, the catalog) and record each result on the connection. Never creates anything
billable.
"""

from __future__ import annotations

from shared.clock import now
from shared.context import Context
from shared.errors import ProviderError
from shared.log import get_logger
from shared.models import (
    CatalogRecord,
    Check,
    CheckStatus,
    ConnectionMessage,
    ConnectionRecord,
    ConnectionStatus,
    GpuOffer,
)
from shared.runs.org_backends import STORAGE_SLOT, compute_for, connection_of_slot, storage_for
from shared.runs.outbox import send_event
from shared.runs.scope import held_machines_check


def offers_of(connection: str, offers: list[GpuOffer]) -> list[GpuOffer]:
    """The offers as the catalog keeps them: each names the connection it is offered through."""
    return [o.model_copy(update={"connection": connection}) for o in offers]


def _run_checks(ctx: Context, rec: ConnectionRecord) -> tuple[list[Check], CatalogRecord | None]:
    if rec.slot == STORAGE_SLOT:
        return storage_for(ctx, rec.org).validate(), None
    name = connection_of_slot(rec.slot)  # each named connection is checked and priced on its own
    provider = compute_for(ctx, rec.org, name)
    checks = list(provider.validate())
    checks.extend(held_machines_check(ctx, rec.org, name, provider))
    catalog = None
    if not any(c.status == CheckStatus.fail for c in checks):
        try:
            offers = offers_of(name, provider.offers())
            catalog = CatalogRecord(org=rec.org, provider=rec.provider, connection=name, offers=offers, fetched_at=now())
            checks.append(Check(name="catalog", status=CheckStatus.ok if offers else CheckStatus.fail,
                                message=f"{len(offers)} supported GPU offers priced" if offers else
                                "no supported GPU offer is available with this setup; see the checks above"))
        except ProviderError as exc:
            checks.append(Check(name="catalog", status=CheckStatus.fail, message=f"the catalog did not load: {exc.reason}"))
    return checks, catalog


def validate_connection(ctx: Context, msg: ConnectionMessage) -> None:
    org, slot = msg.org, msg.slot
    store = ctx.store
    got = store.connections.get(org, slot)
    if not got:
        return  # deleted since the message was sent
    rec, _ = got
    try:
        checks, catalog = _run_checks(ctx, rec)
    except ProviderError as exc:
        checks, catalog = [Check(name="connection", status=CheckStatus.fail, message=exc.reason)], None
    except Exception as exc:  # a check must report, not crash the step into poison
        # The exception's text stays in the log: it may name a proxy URL or an internal host (issue 28.17).
        get_logger().exception("connection check crashed")
        checks, catalog = [Check(name="connection", status=CheckStatus.fail, message=(
            f"the check could not run ({type(exc).__name__}); the control plane's log has the details")
        )], None
    status = ConnectionStatus.failed if any(c.status == CheckStatus.fail for c in checks) else ConnectionStatus.connected
    if catalog is not None:
        store.catalogs.put(catalog)
    current = store.connections.get(org, slot)
    if current is None or current[0].revision != rec.revision:
        return  # saved again meanwhile: that save's own check reports
    store.connections.put(current[0].model_copy(update={"status": status, "checks": checks, "checked_at": now()}),
                         current[1])
    if status == ConnectionStatus.failed:
        _tell_failed(ctx, rec, checks)


def _tell_failed(ctx: Context, rec: ConnectionRecord, checks: list[Check]) -> None:
    """connection.check_failed to the org's webhooks: once per saved revision and set of failing checks (the id
    is derived from them, so a re-run of this step after a crash sends it under the same id)."""
    import hashlib
    import re

    failing = sorted(c.name for c in checks if c.status == CheckStatus.fail)
    digest = hashlib.sha256(f"{rec.slot}|{rec.revision}|{','.join(failing)}".encode()).hexdigest()[:16]
    ident = f"msg_conn-{re.sub(r'[^A-Za-z0-9_-]', '-', rec.slot)[:40]}-{digest}"
    # The checks' names only: their messages may quote the cloud's words, which stay in the connection's view.
    send_event(ctx, rec.org, "connection.check_failed", ident, {"connection": rec.slot, "failed_checks": failing})
