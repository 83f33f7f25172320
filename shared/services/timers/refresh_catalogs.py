"""The hourly catalog timer: one refresh-catalog message per connected compute connection."""

from __future__ import annotations

from shared.context import Context
from shared.models import ConnectionMessage, ConnectionStatus
from shared.steps import Step


def queue_all_refreshes(ctx: Context) -> int:
    count = 0
    for rec in ctx.store.connections.all_orgs():
        if rec.slot.startswith("compute:") and rec.status == ConnectionStatus.connected:
            ctx.queues.send(Step.refresh_catalog, ConnectionMessage(org=rec.org, slot=rec.slot))
            count += 1
    return count
