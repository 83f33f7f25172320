"""An org's saved connections: one row per slot (`storage`, `compute:<provider>`, and a named compute
connection's `compute:<provider>/<name>`), written with its ETag. RowKeys may not hold '/': row_key
spells it '|' (and ':' '~'), so the default connection's row is where it always was."""

from __future__ import annotations

import re

from shared.models import ConnectionRecord
from shared.store.keys import org_key, row_key
from shared.store.tables import Table

_SLOT = re.compile(r"^(storage|compute:[a-z][a-z0-9_-]{0,31}(/[a-z0-9][a-z0-9-]{0,39})?)$")


class Connections:
    def __init__(self, table: Table) -> None:
        self._table = table

    def get(self, org: str, slot: str) -> tuple[ConnectionRecord, str] | None:
        if not isinstance(slot, str) or not _SLOT.fullmatch(slot):
            return None  # no provider has such a name: nothing is saved under it
        got = self._table.get(org_key(org), row_key(slot))
        return (ConnectionRecord.model_validate(got[0]), got[1]) if got else None

    def put(self, rec: ConnectionRecord, etag: str | None) -> str:
        data = rec.model_dump(mode="json")
        if etag is None:
            return self._table.insert(rec.org, row_key(rec.slot), data, provider=rec.provider)
        return self._table.update(rec.org, row_key(rec.slot), data, etag, provider=rec.provider)

    def delete(self, org: str, slot: str) -> None:
        if isinstance(slot, str) and _SLOT.fullmatch(slot):
            self._table.delete(org_key(org), row_key(slot))

    def in_org(self, org: str) -> list[ConnectionRecord]:
        q = self._table.query("PartitionKey eq @org", org=org_key(org))
        return [ConnectionRecord.model_validate(d) for d, _ in q]

    def all_orgs(self) -> list[ConnectionRecord]:
        """Every org's connections: the sweeper and the catalog timer only, never a user request."""
        return [ConnectionRecord.model_validate(d) for d, _ in self._table.query()]
