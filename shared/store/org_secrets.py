"""An org's sealed secrets (a Hugging Face token, ...), one row per name; the value is sealed by
shared/security.py before it gets here."""

from __future__ import annotations

from shared.models import OrgSecretRecord
from shared.store.keys import id_key, org_key
from shared.store.tables import Table


class OrgSecrets:
    def __init__(self, table: Table) -> None:
        self._table = table

    def get(self, org: str, name: str) -> OrgSecretRecord | None:
        got = self._table.get(org_key(org), id_key(name, "secret"))
        return OrgSecretRecord.model_validate(got[0]) if got else None

    def put(self, rec: OrgSecretRecord) -> None:
        self._table.upsert(org_key(rec.org), id_key(rec.name, "secret"), rec.model_dump(mode="json"))

    def delete(self, org: str, name: str) -> None:
        self._table.delete(org_key(org), id_key(name, "secret"))
