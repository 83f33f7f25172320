"""A run's timeline: one row per event in the run's partition, oldest first, and the same event under a
descending key in a partition of its own (`<run id>~newest`: `~` is in no run id), so the run view reads
the newest page in one query (Table storage reads keys ascending only). How many events of one source
a run has taken is counted in the quotas table (shared/runs/events.py bounds them)."""

from __future__ import annotations

from shared.errors import ConcurrencyError, Conflict
from shared.models import RunEvent
from shared.store.keys import id_key, org_key, time_key
from shared.store.tables import MAX_RACE_RETRIES, Table


def _descending(event_key: str) -> str:
    """An event key's mirror: later events sort first."""
    micros, tail = event_key.split("-", 1)
    return f"{10**20 - 1 - int(micros):020d}-{tail}"


def _newest_partition(run_id: str) -> str:
    return f"{run_id}~newest"


class Events:
    def __init__(self, events: Table, quotas: Table) -> None:
        self._table = events
        self._quotas = quotas

    def add(self, run_id: str, event: RunEvent) -> None:
        key, data = time_key(), event.model_dump(mode="json")
        self._table.upsert(run_id, key, data, kind=event.kind)
        self._table.upsert(_newest_partition(run_id), _descending(key), data, kind=event.kind)

    def prune(self, run_id: str) -> int:
        """Delete the run's timeline (both copies); returns how many rows."""
        return self._table.delete_partition(run_id) + self._table.delete_partition(_newest_partition(run_id))

    def count(self, org: str, run_id: str, source: str, limit: int) -> int:
        """Count one more event of `source` on a run: the count with this one, which stops at limit + 1,
        so a flood past the bound costs one read per event and no write."""
        key = f"events~{id_key(run_id, 'run')}~{source}"
        for _ in range(MAX_RACE_RETRIES):
            got = self._quotas.get(org_key(org), key)
            count = int(got[0].get("count", 0)) if got else 0
            if count > limit:
                return count + 1  # not written: past the bound, nothing more is counted
            try:
                if got is None:
                    self._quotas.insert(org, key, {"count": 1})
                else:
                    self._quotas.update(org, key, {"count": count + 1}, got[1])
                return count + 1
            except (ConcurrencyError, Conflict):
                continue  # another writer counted meanwhile: read again
        return limit + 2  # that many writers at once is a flood: the event is dropped

    def newest(self, run_id: str, *, exclude_kind: str | None = None, limit: int) -> list[RunEvent]:
        """A run's newest `limit` events (one query), oldest first; events written before the descending
        copy existed are not in it."""
        clauses, params = ["PartitionKey eq @r"], {"r": _newest_partition(run_id)}
        if exclude_kind:
            clauses.append("kind ne @x")
            params["x"] = exclude_kind
        q = self._table.query(" and ".join(clauses), top=limit, **params)
        return [RunEvent.model_validate(d) for d, _ in q][:limit][::-1]

    def read(self, run_id: str, kind: str | tuple[str, ...] | None = None, *, exclude_kind: str | None = None,
             limit: int | None = None) -> list[RunEvent]:
        """A run's events, oldest first, of one kind or any of several; `limit` bounds the read (one page of
        at most `limit`)."""
        clauses, params = ["PartitionKey eq @r"], {"r": run_id}
        kinds = (kind,) if isinstance(kind, str) else kind or ()
        if kinds:
            clauses.append("( " + " or ".join(f"kind eq @k{i}" for i in range(len(kinds))) + " )")
            params.update({f"k{i}": k for i, k in enumerate(kinds)})
        if exclude_kind:
            clauses.append("kind ne @x")  # logs of older runs were events of kind "log"
            params["x"] = exclude_kind
        q = self._table.query(" and ".join(clauses), top=limit, **params)
        return [RunEvent.model_validate(d) for d, _ in q]
