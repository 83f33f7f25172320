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
import time
from dataclasses import dataclass
from functools import lru_cache

from shared.clock import now_ts
from shared.errors import ConcurrencyError, Conflict, NotFound
from shared.lifecycle import HOLDS_MACHINE
from shared.models import (
    RunState,
)
from shared.store.audit import Audit
from shared.store.catalogs import Catalogs
from shared.store.connections import Connections
from shared.store.events import Events
from shared.store.keys import org_key
from shared.store.ledger import Ledger
from shared.store.logs import Logs
from shared.store.org_secrets import OrgSecrets
from shared.store.projects import Datasets, Projects
from shared.store.runs import Runs
from shared.store.tables import MAX_RACE_RETRIES, Table
from shared.store.throughput import Throughput
from shared.store.watch import WatchIndex

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
        self.watch = WatchIndex(self.table("watch"))
        self.runs = Runs(self.table("runs"), self.watch, ended=self.release_active_slot)
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
            holding = {r.id for r in self.runs.active(org)}
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
            run, _ = self.runs.get(org, run_id)
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
