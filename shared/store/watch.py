"""The watch index: the runs that hold a machine or wait on a deadline (WATCHED), one row each in the
`watch` table (PartitionKey org, RowKey run id), so the timers read what is active, never every run ever
kept. Kept by the one write of a state change (Runs.mutate): the row is written before a run enters a
watched state and deleted after it leaves, so a crash between the two writes leaves an extra row, never a
watched run without one. heartbeat-check prunes extra rows, and the index is built once from the runs
table where it is missing (Runs.build_watch_index: records written before the index existed)."""

from __future__ import annotations

from shared.lifecycle import HOLDS_MACHINE
from shared.store.keys import org_key
from shared.store.tables import Table

# The run states the watch index holds: a machine may bill, or a deadline or a step is pending.
WATCHED = HOLDS_MACHINE
_BUILT = ("~", "built")  # the marker row (no org is "~"), never removed


class WatchIndex:
    def __init__(self, table: Table) -> None:
        self._table = table
        self._built = False  # this process has seen the marker: no read on every tick

    def add(self, org: str, run_id: str) -> None:
        self._table.upsert(org_key(org), run_id, {"org": org, "run_id": run_id})

    def remove(self, org: str, run_id: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._table.delete(org_key(org), run_id)
        except ResourceNotFoundError:
            pass

    def ids(self, org: str | None = None) -> list[tuple[str, str]]:
        """(org, run id) of every indexed run, or one org's: one query of the index."""
        q = self._table.query("PartitionKey eq @org", org=org_key(org)) if org else self._table.query()
        return [(d["org"], d["run_id"]) for d, _ in q if d["org"] != "~"]  # "~": the marker and liveness rows

    def built(self) -> bool:
        if not self._built:
            self._built = self._table.get(*_BUILT) is not None
        return self._built

    def mark_built(self, runs: int) -> None:
        self._table.upsert(*_BUILT, {"org": "~", "run_id": "~", "runs": runs})
        self._built = True
