"""The ledger: every cloud resource ever recorded for a run (one row per provider, kind and id), kept
after the run's own record of what it holds has moved on."""

from __future__ import annotations

from shared.models import CloudResource
from shared.store.keys import row_key
from shared.store.tables import Table


class Ledger:
    def __init__(self, table: Table) -> None:
        self._table = table

    def record(self, res: CloudResource) -> None:
        data = res.model_dump(mode="json")
        self._table.upsert(res.run_id or "-", row_key(f"{res.provider}:{res.kind}:{res.id}"), data, org=res.org)

    def read(self, run_id: str) -> list[CloudResource]:
        q = self._table.query("PartitionKey eq @r", r=run_id)
        return [CloudResource.model_validate(d) for d, _ in q]
