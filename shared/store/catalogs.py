"""Each org's offer catalog per provider, as last refreshed (one row each)."""

from __future__ import annotations

from shared.models import CatalogRecord
from shared.store.tables import Table


class Catalogs:
    def __init__(self, table: Table) -> None:
        self._table = table

    def get(self, org: str, provider: str) -> CatalogRecord | None:
        got = self._table.get(org, provider)
        return CatalogRecord.model_validate(got[0]) if got else None

    def put(self, rec: CatalogRecord) -> None:
        self._table.upsert(rec.org, rec.provider, rec.model_dump(mode="json"))
