"""The audit trail of what the control plane did on its own (sweeper actions, poison discards): one
partition per day, rows in time order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shared.clock import now
from shared.store.keys import time_key
from shared.store.tables import Table


class Audit:
    def __init__(self, table: Table) -> None:
        self._table = table

    def add(self, action: str, **data: Any) -> None:
        event = {"at": now().isoformat(), "action": action, **data}
        self._table.upsert(now().strftime("%Y%m%d"), time_key(), event, action=action)

    def read(self) -> Iterator[dict[str, Any]]:
        for d, _ in self._table.query():
            yield d
