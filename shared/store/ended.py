"""The ended runs whose history (events and logs) waits for its prune: one row per run, keyed by when it is
due, so the prune timer reads only the rows that are due (shared/services/timers/prune_history.py).

A run ended at `ended_at` is first due a day later (the lowest retention an org can set); the timer then reads
its org's retention and, where that is longer, writes the row again at `ended_at + retention`. So a row is
read at most twice (again only when an owner raised the limit meanwhile), whatever the runs ever kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.store.tables import Table

DUE = "due"
FIRST_DUE_S = 24 * 3600  # the lowest retention_limit_s an org can set (shared/runs/org_limits.py)


@dataclass(frozen=True)
class Ended:
    org: str
    run_id: str
    ended_at: float
    due: float


def _key(due: float, org: str, run_id: str) -> str:
    return f"{int(due):012d}~{org}~{run_id}"


class EndedIndex:
    def __init__(self, table: Table) -> None:
        self._table = table

    def _put(self, org: str, run_id: str, ended_at: float, due: float) -> None:
        self._table.upsert(DUE, _key(due, org, run_id), {"org": org, "run_id": run_id, "ended_at": ended_at,
                                                         "due": due})

    def add(self, org: str, run_id: str, ended_at: float) -> None:
        self._put(org, run_id, ended_at, ended_at + FIRST_DUE_S)

    def due(self, at: float, limit: int) -> list[Ended]:
        """Up to `limit` rows due at `at`, the longest due first."""
        rows = self._table.query("PartitionKey eq @p and RowKey lt @k", top=limit, p=DUE, k=f"{int(at):012d}~")
        return [Ended(d["org"], d["run_id"], float(d["ended_at"]), float(d["due"])) for d, _ in rows]

    def later(self, row: Ended, due: float) -> None:
        """Due again at `due` (its org keeps history longer): written before the old row is deleted."""
        self._put(row.org, row.run_id, row.ended_at, due)
        self.done(row)

    def done(self, row: Ended) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._table.delete(DUE, _key(row.due, row.org, row.run_id))
        except ResourceNotFoundError:
            pass  # another tick did it
