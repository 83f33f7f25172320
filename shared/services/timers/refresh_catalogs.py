"""The hourly catalog timer: one refresh-catalog message per connected compute connection."""

from __future__ import annotations

from shared.models import ConnectionMessage, ConnectionStatus
from shared.queues import get_queues
from shared.steps import Step
from shared.store import get_store


def queue_all_refreshes() -> int:
    count = 0
    for rec in get_store().connections.all_orgs():
        if rec.slot.startswith("compute:") and rec.status == ConnectionStatus.connected:
            get_queues().send(Step.refresh_catalog, ConnectionMessage(org=rec.org, slot=rec.slot))
            count += 1
    return count
