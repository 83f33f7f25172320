"""Projects and their dataset versions, one table each, keyed by org and id."""

from __future__ import annotations

from shared.errors import NotFound
from shared.models import DatasetVersionRecord, ProjectRecord
from shared.store.keys import id_key, org_key
from shared.store.tables import Table


class Projects:
    def __init__(self, table: Table) -> None:
        self._table = table

    def create(self, rec: ProjectRecord) -> None:
        self._table.insert(rec.org, rec.id, rec.model_dump(mode="json"))

    def get(self, org: str, project_id: str) -> ProjectRecord:
        got = self._table.get(org_key(org), id_key(project_id, f"project {project_id!r:.80}"))
        if not got:
            raise NotFound(f"project {project_id} not found")
        return ProjectRecord.model_validate(got[0])

    def in_org(self, org: str) -> list[ProjectRecord]:
        q = self._table.query("PartitionKey eq @org", org=org_key(org))
        return [ProjectRecord.model_validate(d) for d, _ in q]

    def page(self, org: str, *, limit: int, after: str | None = None) -> tuple[list[ProjectRecord], str | None]:
        """One page of the org's projects in id order, and the RowKey the next page starts after."""
        got, nxt = self._table.page("PartitionKey eq @org and RowKey gt @after", limit=limit,
                                    org=org_key(org), after=after or "")
        return [ProjectRecord.model_validate(d) for d, _ in got], nxt


class Datasets:
    def __init__(self, table: Table) -> None:
        self._table = table

    def create(self, rec: DatasetVersionRecord) -> None:
        self._table.insert(rec.org, rec.id, rec.model_dump(mode="json"), project=rec.project_id)

    def get(self, org: str, dataset_id: str) -> DatasetVersionRecord:
        got = self._table.get(org_key(org), id_key(dataset_id, f"dataset version {dataset_id!r:.80}"))
        if not got:
            raise NotFound(f"dataset version {dataset_id} not found")
        return DatasetVersionRecord.model_validate(got[0])

    def page(self, org: str, project_id: str, *, limit: int, after: str | None = None
             ) -> tuple[list[DatasetVersionRecord], str | None]:
        """One page of a project's dataset versions in id order, and the RowKey the next page starts after."""
        got, nxt = self._table.page("PartitionKey eq @org and project eq @p and RowKey gt @after",
                                    limit=limit, org=org_key(org), p=project_id, after=after or "")
        return [DatasetVersionRecord.model_validate(d) for d, _ in got], nxt
