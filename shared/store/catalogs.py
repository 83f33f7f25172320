"""Each org's offer catalog per compute connection, as last refreshed (one row each, keyed by the
connection's name: `aws` as before, `aws/us-west-2` spelled `aws|us-west-2`)."""

from __future__ import annotations

from shared.models import CatalogRecord
from shared.store.keys import row_key
from shared.store.tables import Table


class Catalogs:
    def __init__(self, table: Table) -> None:
        self._table = table

    def get(self, org: str, connection: str) -> CatalogRecord | None:
        got = self._table.get(org, row_key(connection))
        return CatalogRecord.model_validate(got[0]) if got else None

    def put(self, rec: CatalogRecord) -> None:
        self._table.upsert(rec.org, row_key(rec.connection or rec.provider), rec.model_dump(mode="json"))
