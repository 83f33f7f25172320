"""Repositories for every record the control plane keeps, on Azure Table storage.

Tables (prefix from settings): connections, catalogs, projects, datasets, runs,
events (run events), logs (agent log lines in bounded chunks), ledger (every cloud resource ever recorded for a run),
audit (sweeper actions, poison discards), secrets, quotas (org limits, rate-limit windows, and
the active-run reservations that hold max_active_runs: reserve_active_slot), keys (when each JWT
key was first seen: shared/key_rotation.py).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from shared.clock import now, now_ts
from shared.errors import ConcurrencyError, Conflict, NotFound
from shared.lifecycle import HOLDS_MACHINE, TERMINAL
from shared.models import (
    RunRecord,
    RunState,
)
from shared.store.audit import Audit
from shared.store.catalogs import Catalogs
from shared.store.connections import Connections
from shared.store.events import Events
from shared.store.keys import id_key, org_key
from shared.store.ledger import Ledger
from shared.store.logs import Logs
from shared.store.org_secrets import OrgSecrets
from shared.store.projects import Datasets, Projects
from shared.store.tables import MAX_RACE_RETRIES, Table
from shared.store.throughput import Throughput
from shared.store.watch import WATCHED, WatchIndex

LAST_RUNS_KEPT = 1024  # runs whose last-seen copy a process keeps for heartbeats
# The quotas-table row of an org's active-run reservations, and how long a reservation whose
# run is still a draft counts: a launch reserves before it writes the run queued, and that
# takes seconds (an HTTP request); one older is a launch that died in between.
ACTIVE_RUNS_KEY = "active-runs"
LAUNCH_GRACE_S = 600


@dataclass(frozen=True)
class ActiveSlot:
    granted: bool
    added: bool  # this call wrote the reservation (a failed launch frees only what it added)
    active: int  # the org's active runs as counted, this one included when added


class Store:
    def __init__(self, connection_string: str, prefix: str) -> None:
        from azure.data.tables import TableServiceClient

        from shared.storage_account import service_client
        from shared.storage_transport import storage_client_kwargs

        self._service = service_client(TableServiceClient, "table", connection_string, **storage_client_kwargs())
        self.prefix = prefix
        names = ("connections", "catalogs", "projects", "datasets", "runs", "events", "logs", "ledger", "audit",
                 "secrets", "quotas", "watch", "leases", "sweeps", "throughput", "keys")
        self._tables = {n: Table(self._service, f"{prefix}{n}") for n in names}
        self._last_runs: OrderedDict[tuple[str, str], tuple[RunRecord, str]] = OrderedDict()
        self._runs_lock = threading.Lock()
        self.watch = WatchIndex(self.table("watch"))
        self.audit = Audit(self.table("audit"))
        self.ledger = Ledger(self.table("ledger"))
        self.logs = Logs(self.table("logs"))
        self.events = Events(self.table("events"), self.table("quotas"))
        self.throughput = Throughput(self.table("throughput"))
        self.projects = Projects(self.table("projects"))
        self.datasets = Datasets(self.table("datasets"))
        self.catalogs = Catalogs(self.table("catalogs"))
        self.secrets = OrgSecrets(self.table("secrets"))
        self.connections = Connections(self.table("connections"))

    def table(self, name: str) -> Table:
        return self._tables[name]

    def drop_all(self) -> None:
        """Tests only: delete this prefix's tables."""
        for t in self._tables.values():
            self._service.delete_table(t.name)
            t._client = None

    # ------------------------------------------------------------ runs
    def create_run(self, rec: RunRecord) -> str:
        return self.table("runs").insert(rec.org, rec.id, rec.model_dump(mode="json"), state=rec.state.value,
                                         project=rec.project_id)

    def get_run(self, org: str, run_id: str) -> tuple[RunRecord, str]:
        got = self.table("runs").get(org_key(org), id_key(run_id, f"run {run_id!r:.80}"))
        if not got:
            raise NotFound(f"run {run_id} not found")
        return RunRecord.model_validate(got[0]), got[1]

    def put_run(self, rec: RunRecord, etag: str) -> str:
        return self.table("runs").update(rec.org, rec.id, rec.model_dump(mode="json"), etag, state=rec.state.value,
                                         project=rec.project_id)

    def delete_run(self, org: str, run_id: str, etag: str) -> None:
        """Delete a run record as read (ETag); a run changed since then raises Conflict."""
        try:
            self.table("runs").delete(org_key(org), id_key(run_id, f"run {run_id!r:.80}"), etag=etag)
        except ConcurrencyError as exc:
            raise Conflict(f"run {run_id} changed while it was being deleted (launched?); nothing was deleted") \
                from exc

    def list_runs(self, org: str, states: set[RunState] | frozenset[RunState] | None = None) -> list[RunRecord]:
        return self._query_runs(org_key(org), states)

    def list_runs_page(self, org: str, *, limit: int, after: str | None = None,
                       states: set[RunState] | frozenset[RunState] | None = None,
                       project: str | None = None) -> tuple[list[RunRecord], str | None]:
        """One page of the org's runs, newest first, and the RowKey the next page starts after (None at
        the end). Newest-first ids (shared/ids.py) are read first, then the ids from before them
        (in id order). Filters: the state column, and the project column (every run write sets it; a
        run last written before it existed is not found by a project filter)."""
        from shared.ids import NEWEST_FIRST_FROM

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
        table = self.table("runs")
        if after is None or after >= split:  # newest-first ids first
            q = " and ".join([*clauses, "RowKey gt @after" if after else "RowKey ge @after"])
            got, nxt = table.page(q, limit=limit, **params, after=after or split)
            runs = [RunRecord.model_validate(d) for d, _ in got]
            if nxt is not None:
                return runs, nxt
            if len(runs) >= limit:
                return runs, "r-"  # the older ids' range comes next
            after = "r-"
        q = " and ".join([*clauses, "RowKey gt @after", "RowKey lt @split"])
        got, nxt = table.page(q, limit=limit - len(runs), **params, after=after, split=split)
        return runs + [RunRecord.model_validate(d) for d, _ in got], nxt

    def list_runs_all_orgs(self, states: set[RunState] | frozenset[RunState] | None = None) -> list[RunRecord]:
        """Every org's runs: the heartbeat check, the sweeper and admin services only."""
        return self._query_runs(None, states)

    def _query_runs(self, org: str | None, states: set[RunState] | frozenset[RunState] | None) -> list[RunRecord]:
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if org is not None:
            clauses.append("PartitionKey eq @org")
            params["org"] = org
        if states:
            names = sorted(s.value for s in states)
            clauses.append("( " + " or ".join(f"state eq @s{i}" for i in range(len(names))) + " )")
            params.update({f"s{i}": n for i, n in enumerate(names)})
        q = self.table("runs").query(" and ".join(clauses) if clauses else None, **params)
        return [RunRecord.model_validate(d) for d, _ in q]

    def mutate_run(
        self, org: str, run_id: str, change: Callable[[RunRecord], RunRecord | None],
        *, attempts: int = MAX_RACE_RETRIES, from_last_write: bool = False,
    ) -> tuple[RunRecord, bool]:
        """Read-modify-write with the ETag; `change` returns None to leave the run as it is.

        Returns (run as stored now, whether this call wrote it). Lost races re-read and
        call `change` again, so it must decide from the run it is given. Each call is one
        read and at most one write per attempt.

        from_last_write (heartbeats): first try the write on the run as this process last read
        or wrote it, with that ETag, skipping the read. A stale copy only costs a lost race
        (the service refuses the ETag) and the usual read; a decision not to write is never
        taken on the copy, always on the stored run. Not counted as an attempt.
        """
        attempt = 0
        cached = self._recall_run(org, run_id) if from_last_write else None
        while attempt < attempts:
            run, etag = cached or self.get_run(org, run_id)
            from_copy, cached = cached is not None, None
            new = change(run)
            if new is None:
                if from_copy:
                    continue  # decide again on the stored run
                self._remember_run(run, etag)
                return run, False
            if new.state in WATCHED and run.state not in WATCHED:
                self.watch.add(new.org, new.id)  # indexed before it is watched (shared/store/watch.py)
            try:
                etag = self.put_run(new, etag)
            except ConcurrencyError:
                self._forget_run(org, run_id)
                if from_copy:
                    continue
                # Someone else wrote in between: a short random pause spreads the writers out,
                # so a crowd of them converges instead of colliding again on every retry.
                attempt += 1
                time.sleep(random.uniform(0, 0.002 * attempt))
                continue
            self._remember_run(new, etag)
            if run.state in WATCHED and new.state not in WATCHED:
                self.watch.remove(org, run_id)
            if new.state in TERMINAL and run.state not in TERMINAL:
                # The run has ended: its active-run slot is free. A crash before this line leaves
                # the reservation of an ended run, which the next reservation drops.
                self.release_active_slot(org, run_id)
            return new, True
        raise ConcurrencyError(f"run {run_id} kept changing; try again")

    def get_runs(self, keys: list[tuple[str, str]], threads: int = 8) -> list[RunRecord]:
        """The runs named by (org, run id), read by point reads in parallel; a missing one is skipped."""
        from concurrent.futures import ThreadPoolExecutor

        def one(key: tuple[str, str]) -> RunRecord | None:
            try:
                return self.get_run(*key)[0]
            except NotFound:
                return None

        if len(keys) <= 1:
            found = [one(k) for k in keys]
        else:
            with ThreadPoolExecutor(max_workers=min(threads, len(keys))) as pool:
                found = list(pool.map(one, keys))
        return [r for r in found if r is not None]

    def active_runs(self, org: str) -> list[RunRecord]:
        """The org's runs that hold a machine (or wait to), from the watch index: cost grows with
        its active runs, not with every run it ever had."""
        return [r for r in self.get_runs(self.watch.ids(org_key(org))) if r.state in WATCHED]

    def build_watch_index(self) -> int | None:
        """Index the watched runs of records written before the index existed, once per deployment
        (a marker row says it is done). One scan of the runs table, ever. Returns the runs indexed,
        or None when it was done before."""
        if self.watch.built():
            return None
        runs = self._query_runs(None, WATCHED)
        for run in runs:
            self.watch.add(run.org, run.id)
        self.watch.mark_built(len(runs))
        return len(runs)

    # The runs this process last read or wrote through mutate_run, with their ETags (bounded).
    def _remember_run(self, run: RunRecord, etag: str) -> None:
        with self._runs_lock:
            self._last_runs.pop((run.org, run.id), None)
            self._last_runs[(run.org, run.id)] = (run, etag)
            while len(self._last_runs) > LAST_RUNS_KEPT:
                self._last_runs.popitem(last=False)

    def _recall_run(self, org: str, run_id: str) -> tuple[RunRecord, str] | None:
        with self._runs_lock:
            return self._last_runs.get((org, run_id))

    def _forget_run(self, org: str, run_id: str) -> None:
        with self._runs_lock:
            self._last_runs.pop((org, run_id), None)

    def claim_launch(self, org: str, run_id: str, *, settle_s: float) -> tuple[RunRecord, bool]:
        """Claim a provisioning run with no recorded resources for one create attempt.

        The claim is its own field (launch_claimed_at), written with the run's ETag, and granted only
        settle_s after the previous claim (the move to provisioning is the first): a create that
        crashed or timed out may have made a machine that listing does not show yet, so two attempts
        closer together could each create one. Other writes (a heartbeat, a note) do not extend it.
        Returns (run as stored now, whether this call claimed it).
        """

        def change(r: RunRecord) -> RunRecord | None:
            if r.state != RunState.provisioning or r.resources:
                return None
            # Records from before the field: their last write was the claim.
            last = r.launch_claimed_at or r.updated_at
            if (now() - last).total_seconds() < settle_s:
                return None
            return r.model_copy(update={"launch_claimed_at": now(), "updated_at": now()})

        return self.mutate_run(org, run_id, change)

    # ------------------------------------------------------------ active-run reservations
    # max_active_runs is one atomic decision: the org's reservations, keyed by run
    # id, are one quotas-table row written with its ETag, so two launches that both saw a free
    # slot cannot both take it (the second write is refused, re-reads and counts again). Keyed
    # by run id, a repeated reservation or release is a no-op; a reservation left behind by a
    # crash is dropped when counting once its run has ended (or, still a draft, after
    # LAUNCH_GRACE_S). The row holds at most max_active_runs (<= 1000) ids with a timestamp,
    # about 30 characters each: under the 32K-character property limit.

    def reserve_active_slot(self, org: str, run_id: str, limit: int) -> ActiveSlot:
        """Reserve one of the org's `limit` active-run slots for run_id (or find it reserved).

        Active = a reservation still in force, or a run holding a machine (a run launched
        before reservations existed counts too). Granted when run_id holds a slot already or
        fewer than `limit` are active; the write is ETag-guarded, a lost race counts again.
        """
        table = self.table("quotas")
        for attempt in range(MAX_RACE_RETRIES):
            got = table.get(org_key(org), ACTIVE_RUNS_KEY)
            held: dict[str, int] = dict(got[0].get("runs", {})) if got else {}
            holding = {r.id for r in self.active_runs(org)}
            kept = {rid: at for rid, at in held.items() if rid in holding or self._launching(org, rid, at)}
            active = len(set(kept) | holding)
            if run_id in kept:
                return ActiveSlot(granted=True, added=False, active=active)
            if active >= limit:
                return ActiveSlot(granted=False, added=False, active=active)
            kept[run_id] = int(now_ts())  # the ended runs' reservations dropped above go with this write
            try:
                if got is None:
                    table.insert(org, ACTIVE_RUNS_KEY, {"runs": kept})
                else:
                    table.update(org, ACTIVE_RUNS_KEY, {"runs": kept}, got[1])
            except (ConcurrencyError, Conflict):
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # spread a crowd of launches out
                continue
            return ActiveSlot(granted=True, added=True, active=active + 1)
        raise ConcurrencyError("the organization's active runs kept changing; try again")

    def _launching(self, org: str, run_id: str, reserved_at: int) -> bool:
        """A reservation whose run held no machine when the runs were listed: still in force
        when its launch has written the run since, or may still be under way (the run is a
        draft and the reservation recent). Its run ended, or was deleted: dropped."""
        try:
            run, _ = self.get_run(org, run_id)
        except NotFound:
            return False
        if run.state in HOLDS_MACHINE:
            return True
        return run.state == RunState.draft and now_ts() - reserved_at < LAUNCH_GRACE_S

    def release_active_slot(self, org: str, run_id: str) -> None:
        """Free run_id's reservation; releasing one that is gone (released twice) changes nothing."""
        table = self.table("quotas")
        for _ in range(MAX_RACE_RETRIES):
            got = table.get(org_key(org), ACTIVE_RUNS_KEY)
            held = dict(got[0].get("runs", {})) if got else {}
            if got is None or run_id not in held:
                return
            del held[run_id]
            try:
                table.update(org, ACTIVE_RUNS_KEY, {"runs": held}, got[1])
                return
            except ConcurrencyError:
                continue
        # Still racing after the retries: left for the next reservation, which drops the
        # reservations of ended runs. Never raised: the caller's run write has succeeded.

    def active_reservations(self, org: str) -> dict[str, int]:
        """The org's reservations as stored (run id -> reserved at, epoch seconds), for tests and admins."""
        got = self.table("quotas").get(org_key(org), ACTIVE_RUNS_KEY)
        return dict(got[0].get("runs", {})) if got else {}


_override: Store | None = None


@lru_cache(maxsize=1)  # one client per process, built on first use
def _default_store() -> Store:
    from shared.settings import get_settings

    s = get_settings()
    return Store(s.storage_connection, s.table_prefix)


def get_store() -> Store:
    return _override or _default_store()


def set_store(store: Store | None) -> None:
    """Tests: point every service at a store with its own table prefix."""
    global _override
    _override = store


def reset_store() -> None:
    """Tests: forget the store in use (set or built); the next get_store() builds one from
    the current settings (connection string, table prefix)."""
    set_store(None)
    _default_store.cache_clear()


def _after_fork_in_child() -> None:
    # A forked process (the dev host's extra HTTP workers) must not share the parent's pooled
    # connections: it builds its own store on first use.
    reset_store()


os.register_at_fork(after_in_child=_after_fork_in_child)
