"""A thin wrapper over Azure Table storage with ETag-guarded writes.

Every record is stored as one JSON property (`data`) plus a few plain columns used
in filters. Updates pass the ETag read earlier; a lost race raises ConcurrencyError
(HTTP 412 from the service), and the caller re-reads and decides again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from shared.errors import ConcurrencyError, Conflict

Entity = dict[str, Any]
# How many times a read-decide-write whose ETag lost a race reads and decides again before it gives up.
MAX_RACE_RETRIES = 8


class Table:
    def __init__(self, service: Any, name: str) -> None:
        self._service = service
        self.name = name
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            from azure.core.exceptions import ResourceExistsError

            client = self._service.get_table_client(self.name)
            try:
                client.create_table()
            except ResourceExistsError:
                pass
            self._client = client
        return self._client

    def get(self, pk: str, rk: str) -> tuple[dict[str, Any], str] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            entity = self.client.get_entity(partition_key=pk, row_key=rk)
        except ResourceNotFoundError:
            return None
        return json.loads(entity["data"]), entity.metadata["etag"]

    def insert(self, pk: str, rk: str, data: dict[str, Any], **columns: Any) -> str:
        from azure.core.exceptions import ResourceExistsError

        try:
            meta = self.client.create_entity(entity=_entity(pk, rk, data, columns))
        except ResourceExistsError as exc:
            raise Conflict(f"{self.name} {pk}/{rk} already exists") from exc
        return str(meta["etag"])

    def update(self, pk: str, rk: str, data: dict[str, Any], etag: str, **columns: Any) -> str:
        from azure.core import MatchConditions
        from azure.core.exceptions import HttpResponseError, ResourceModifiedError

        try:
            meta = self.client.update_entity(
                entity=_entity(pk, rk, data, columns),
                mode="replace",
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except ResourceModifiedError as exc:
            raise ConcurrencyError(f"{self.name} {pk}/{rk} changed since it was read") from exc
        except HttpResponseError as exc:
            if exc.status_code in (404, 412):
                raise ConcurrencyError(f"{self.name} {pk}/{rk} changed since it was read") from exc
            raise
        return str(meta["etag"])

    def upsert(self, pk: str, rk: str, data: dict[str, Any], **columns: Any) -> None:
        self.client.upsert_entity(entity=_entity(pk, rk, data, columns), mode="replace")

    def delete(self, pk: str, rk: str, etag: str | None = None) -> None:
        if etag is None:
            self.client.delete_entity(partition_key=pk, row_key=rk)
            return
        from azure.core import MatchConditions
        from azure.core.exceptions import HttpResponseError, ResourceModifiedError

        try:
            self.client.delete_entity(partition_key=pk, row_key=rk, etag=etag,
                                      match_condition=MatchConditions.IfNotModified)
        except ResourceModifiedError as exc:
            raise ConcurrencyError(f"{self.name} {pk}/{rk} changed since it was read") from exc
        except HttpResponseError as exc:
            if exc.status_code == 412:
                raise ConcurrencyError(f"{self.name} {pk}/{rk} changed since it was read") from exc
            raise

    def delete_partition(self, pk: str) -> int:
        """Delete every entity of one partition, in batch transactions of up to 100 (the service's limit for
        one partition); returns how many. Idempotent: what another deleter removed first is not an error."""
        from azure.core.exceptions import HttpResponseError

        keys = [(e["PartitionKey"], e["RowKey"]) for e in self.client.query_entities(
            query_filter="PartitionKey eq @p", parameters={"p": pk}, select=["PartitionKey", "RowKey"])]
        for i in range(0, len(keys), 100):
            ops = [("delete", {"PartitionKey": p, "RowKey": r}) for p, r in keys[i:i + 100]]
            try:
                self.client.submit_transaction(ops)
            except HttpResponseError:  # one entity gone already fails the whole batch: one by one then
                for p, r in keys[i:i + 100]:
                    self.client.delete_entity(partition_key=p, row_key=r)
        return len(keys)

    def query(
        self, filter: str | None = None, *, top: int | None = None, **params: Any
    ) -> Iterator[tuple[dict[str, Any], str]]:
        """Entities in key order. `top` bounds the read: pages of `top` entities (the service's
        $top), and at most `top` entities in all, so a bounded view never pages through a partition."""
        page = {"results_per_page": top} if top else {}
        if filter is None:
            entities = self.client.list_entities(**page)
        else:
            entities = self.client.query_entities(query_filter=filter, parameters=params, **page)
        for n, entity in enumerate(entities):
            if top is not None and n >= top:
                return
            yield json.loads(entity["data"]), entity.metadata["etag"]

    def pages(self, filter: str, *, per_page: int, **params: Any) -> Iterator[tuple[dict[str, Any], str]]:
        """Entities in key order, fetched `per_page` at a time, lazily: the caller stops reading
        when it has enough (a paginated read costs the pages it uses, not the partition)."""
        entities = self.client.query_entities(query_filter=filter, parameters=params, results_per_page=per_page)
        for entity in entities:
            yield json.loads(entity["data"]), entity.metadata["etag"]

    def page(self, filter: str, *, limit: int, max_reads: int = 4, **params: Any
             ) -> tuple[list[tuple[dict[str, Any], str]], str | None]:
        """One page of at most `limit` entities in key order, and the RowKey of its last one when more
        follow (else None). A caller continues by adding `RowKey gt <that key>` to its filter, so a
        position is always read inside the caller's own filter (its partition); the service's own
        continuation tokens are opaque (encoded keys), never handed out. One entity more than the page
        is asked for, to know whether more follow; a filtered query the service answers with a short
        page and a continuation is followed for up to `max_reads` requests."""
        out: list[tuple[dict[str, Any], str]] = []
        keys: list[str] = []
        token: dict[str, str] | None = None
        for _ in range(max_reads):
            pager = self.client.query_entities(query_filter=filter, parameters=params,
                                               results_per_page=limit + 1 - len(out)).by_page(continuation_token=token)
            for e in next(pager, []):
                out.append((json.loads(e["data"]), e.metadata["etag"]))
                keys.append(e["RowKey"])
            token = pager.continuation_token
            if token is None or len(out) > limit:
                break
        more = len(out) > limit or (token is not None and bool(out))
        return out[:limit], (keys[:limit][-1] if more else None)

def _entity(pk: str, rk: str, data: dict[str, Any], columns: dict[str, Any]) -> Entity:
    return {"PartitionKey": pk, "RowKey": rk, "data": json.dumps(data, default=str), **columns}
