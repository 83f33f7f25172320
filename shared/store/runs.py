"""Run records, and the one write that changes them (Runs.decide: read, decide, write with the ETag).

A run is created as a draft (create) and from then on written only by decide (mutate: the same
write for a change with no decision to return), which refuses a state change the transition table
does not allow, keeps the watch index (a run is indexed before it enters a watched state, unindexed
after it leaves) and frees the run's active-run slot when the write ends it. A state change goes
through shared/runs/moves.py, which records the transition event; a write that leaves the state as it
is (a note, a heartbeat's progress) calls mutate directly.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from shared.errors import ConcurrencyError, Conflict, NotFound
from shared.ids import NEWEST_FIRST_FROM
from shared.lifecycle import TERMINAL, check_write
from shared.models import RunRecord, RunState
from shared.store.keys import id_key, org_key
from shared.store.tables import MAX_RACE_RETRIES, Table
from shared.store.watch import WATCHED, WatchIndex

LAST_RUNS_KEPT = 1024  # runs whose last-seen copy a process keeps for heartbeats

States = set[RunState] | frozenset[RunState]
D = TypeVar("D")  # what a change decided, for its caller


def _watched(run: RunRecord) -> bool:
    """Indexed: in a watched state, or holding webhook notices not yet queued (heartbeat-check queues
    them after a crash: shared/runs/outbox.py)."""
    return run.state in WATCHED or bool(run.notices)


class Runs:
    def __init__(self, table: Table, watch: WatchIndex, ended: Callable[[str, str], None]) -> None:
        """`ended(org, run_id)`: called once a write has ended the run (frees its active-run slot)."""
        self._table = table
        self._watch = watch
        self._ended = ended
        self._last: OrderedDict[tuple[str, str], tuple[RunRecord, str]] = OrderedDict()
        self._lock = threading.Lock()

    def create(self, rec: RunRecord) -> str:
        return self._table.insert(rec.org, rec.id, rec.model_dump(mode="json"), state=rec.state.value,
                                  project=rec.project_id)

    def get(self, org: str, run_id: str) -> tuple[RunRecord, str]:
        got = self._table.get(org_key(org), id_key(run_id, f"run {run_id!r:.80}"))
        if not got:
            raise NotFound(f"run {run_id} not found")
        return RunRecord.model_validate(got[0]), got[1]

    def put(self, rec: RunRecord, etag: str) -> str:
        """The write itself, with no index, slot or event kept: mutate's, and tests' (an old record)."""
        return self._table.update(rec.org, rec.id, rec.model_dump(mode="json"), etag, state=rec.state.value,
                                  project=rec.project_id)

    def delete(self, org: str, run_id: str, etag: str) -> None:
        """Delete a run record as read (ETag); a run changed since then raises Conflict."""
        try:
            self._table.delete(org_key(org), id_key(run_id, f"run {run_id!r:.80}"), etag=etag)
        except ConcurrencyError as exc:
            raise Conflict(f"run {run_id} changed while it was being deleted (launched?); nothing was deleted") \
                from exc

    def in_org(self, org: str, states: States | None = None) -> list[RunRecord]:
        return self._query(org_key(org), states)

    def all_orgs(self, states: States | None = None) -> list[RunRecord]:
        """Every org's runs: the heartbeat check, the sweeper and admin services only."""
        return self._query(None, states)

    def page(self, org: str, *, limit: int, after: str | None = None, states: States | None = None,
             project: str | None = None) -> tuple[list[RunRecord], str | None]:
        """One page of the org's runs, newest first, and the RowKey the next page starts after (None at
        the end). Newest-first ids (shared/ids.py) are read first, then the ids from before them
        (in id order). Filters: the state column, and the project column (every run write sets it; a
        run last written before it existed is not found by a project filter)."""
        split = f"r-{NEWEST_FIRST_FROM}"
        clauses: list[str] = ["PartitionKey eq @org"]
        params: dict[str, Any] = {"org": org_key(org)}
        if states:
            names = sorted(s.value for s in states)
            clauses.append("( " + " or ".join(f"state eq @s{i}" for i in range(len(names))) + " )")
            params.update({f"s{i}": n for i, n in enumerate(names)})
        if project is not None:
            clauses.append("project eq @p")
            params["p"] = project
        runs: list[RunRecord] = []
        if after is None or after >= split:  # newest-first ids first
            q = " and ".join([*clauses, "RowKey gt @after" if after else "RowKey ge @after"])
            got, nxt = self._table.page(q, limit=limit, **params, after=after or split)
            runs = [RunRecord.model_validate(d) for d, _ in got]
            if nxt is not None:
                return runs, nxt
            if len(runs) >= limit:
                return runs, "r-"  # the older ids' range comes next
            after = "r-"
        q = " and ".join([*clauses, "RowKey gt @after", "RowKey lt @split"])
        got, nxt = self._table.page(q, limit=limit - len(runs), **params, after=after, split=split)
        return runs + [RunRecord.model_validate(d) for d, _ in got], nxt

    def _query(self, org: str | None, states: States | None) -> list[RunRecord]:
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if org is not None:
            clauses.append("PartitionKey eq @org")
            params["org"] = org
        if states:
            names = sorted(s.value for s in states)
            clauses.append("( " + " or ".join(f"state eq @s{i}" for i in range(len(names))) + " )")
            params.update({f"s{i}": n for i, n in enumerate(names)})
        q = self._table.query(" and ".join(clauses) if clauses else None, **params)
        return [RunRecord.model_validate(d) for d, _ in q]

    def get_many(self, keys: list[tuple[str, str]], threads: int = 8) -> list[RunRecord]:
        """The runs named by (org, run id), read by point reads in parallel; a missing one is skipped."""
        from concurrent.futures import ThreadPoolExecutor

        def one(key: tuple[str, str]) -> RunRecord | None:
            try:
                return self.get(*key)[0]
            except NotFound:
                return None

        if len(keys) <= 1:
            found = [one(k) for k in keys]
        else:
            with ThreadPoolExecutor(max_workers=min(threads, len(keys))) as pool:
                found = list(pool.map(one, keys))
        return [r for r in found if r is not None]

    def active(self, org: str) -> list[RunRecord]:
        """The org's runs that hold a machine (or wait to), from the watch index: cost grows with
        its active runs, not with every run it ever had."""
        return [r for r in self.get_many(self._watch.ids(org_key(org))) if r.state in WATCHED]

    def build_watch_index(self) -> int | None:
        """Index the watched runs of records written before the index existed, once per deployment
        (a marker row says it is done). One scan of the runs table, ever. Returns the runs indexed,
        or None when it was done before."""
        if self._watch.built():
            return None
        runs = self._query(None, WATCHED)
        for run in runs:
            self._watch.add(run.org, run.id)
        self._watch.mark_built(len(runs))
        return len(runs)

    def mutate(
        self, org: str, run_id: str, change: Callable[[RunRecord], RunRecord | None],
        *, attempts: int = MAX_RACE_RETRIES, from_last_write: bool = False,
    ) -> tuple[RunRecord, bool]:
        """decide() for a change with nothing to tell its caller: `change` returns the run to write, or
        None to leave it as it is. Returns (run as stored now, whether this call wrote it)."""
        run, wrote, _ = self.decide(org, run_id, lambda r: (change(r), None), attempts=attempts,
                                    from_last_write=from_last_write)
        return run, wrote

    def decide(
        self, org: str, run_id: str, change: Callable[[RunRecord], tuple[RunRecord | None, D]],
        *, attempts: int = MAX_RACE_RETRIES, from_last_write: bool = False,
    ) -> tuple[RunRecord, bool, D]:
        """The one write of a run: read, decide, write with the ETag.

        `change(run)` returns (the run to write, or None to leave it; its decision). Returns (the run as stored
        now, whether this call wrote it, the decision of the attempt that decided). A lost race re-reads and
        calls `change` again, so its decision is returned, never kept where an earlier attempt wrote too.
        A state change the transition table does not allow (lifecycle.check_write) raises IllegalTransition
        before anything is written. from_last_write (heartbeats): first try the write on this process's last
        copy and ETag, skipping the read (a stale copy costs a lost race; a decision not to write is taken on
        the stored run only; not counted as an attempt).
        """
        attempt = 0
        cached = self._recall(org, run_id) if from_last_write else None
        while attempt < attempts:
            run, etag = cached or self.get(org, run_id)
            from_copy, cached = cached is not None, None
            new, decision = change(run)
            if new is None:
                if from_copy:
                    continue  # decide again on the stored run
                self._remember(run, etag)
                return run, False, decision
            try:
                etag = self._checked_put(run, new, etag)
            except ConcurrencyError:
                self._forget(org, run_id)
                if from_copy:
                    continue
                # Someone else wrote in between: a short random pause spreads the writers out,
                # so a crowd of them converges instead of colliding again on every retry.
                attempt += 1
                time.sleep(random.uniform(0, 0.002 * attempt))
                continue
            self._written(run, new, etag)
            return new, True, decision
        raise ConcurrencyError(f"run {run_id} kept changing; try again")

    def _checked_put(self, run: RunRecord, new: RunRecord, etag: str) -> str:
        """Write `new` over `run` with its ETag, once the transition table allows the change."""
        check_write(run, new)
        if _watched(new) and not _watched(run):
            self._watch.add(new.org, new.id)  # indexed before it is watched (shared/store/watch.py)
        return self.put(new, etag)

    def _written(self, run: RunRecord, new: RunRecord, etag: str) -> None:
        """What follows a write: the copy remembered, the watch index and the active-run slot kept."""
        self._remember(new, etag)
        if _watched(run) and not _watched(new):
            self._watch.remove(new.org, new.id)
        if new.state in TERMINAL and run.state not in TERMINAL:
            # The run has ended: its active-run slot is free. A crash before this line leaves
            # the reservation of an ended run, which the next reservation drops.
            self._ended(new.org, new.id)

    # The runs this process last read or wrote through mutate, with their ETags (bounded).
    def _remember(self, run: RunRecord, etag: str) -> None:
        with self._lock:
            self._last.pop((run.org, run.id), None)
            if run.state in TERMINAL:
                return  # no heartbeat comes for an ended run: a soak held 1,024 ended records per process
            self._last[(run.org, run.id)] = (run, etag)
            while len(self._last) > LAST_RUNS_KEPT:
                self._last.popitem(last=False)

    def _recall(self, org: str, run_id: str) -> tuple[RunRecord, str] | None:
        with self._lock:
            return self._last.get((org, run_id))

    def _forget(self, org: str, run_id: str) -> None:
        with self._lock:
            self._last.pop((org, run_id), None)
