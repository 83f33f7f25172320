"""The state store: one repository per table or aggregate, on Azure Table storage, and `Store`, which
builds them over one table service and hands them out as attributes (store.runs, store.connections, ...).

- store.runs (runs.py): run records and Runs.mutate, the one write that changes a run; it keeps
  store.watch (watch.py: the runs that hold a machine or wait on a deadline) and frees the run's
  reservation in store.slots (slots.py: the active-run reservations that hold max_active_runs);
- store.events (events.py: a run's timeline), store.logs (logs.py: agent log lines in bounded chunks),
  store.ledger (ledger.py: every cloud resource ever recorded for a run), store.audit (audit.py:
  sweeper actions, poison discards), store.ended (ended.py: ended runs whose events and logs wait for their
  prune);
- store.connections, store.secrets (org_secrets.py, sealed), store.catalogs, store.projects and
  store.datasets (projects.py), store.throughput (measured tokens per second, for forecasts),
  store.hub_models (hub_models.py: base models by Hub id and revision, their derived shapes).
Tables with one owner module outside this package, read through `table(name)`: quotas (org limits and
rate-limit windows: shared/runs/org_limits.py, shared/services/api/quotas.py; per-run event counts and
the reservations above are its rows too), leases (leases.py, installation.py), sweeps (the sweeper's
reports), keys (when each JWT key was first seen: shared/key_rotation.py), webhooks (endpoints and
deliveries: shared/webhooks/store.py).
"""

from __future__ import annotations

import os
from functools import lru_cache

from shared.clock import now_ts
from shared.settings import get_settings
from shared.storage_account import service_client
from shared.storage_transport import storage_client_kwargs
from shared.store.audit import Audit
from shared.store.catalogs import Catalogs
from shared.store.connections import Connections
from shared.store.ended import EndedIndex
from shared.store.events import Events
from shared.store.hub_models import HubModels
from shared.store.ledger import Ledger
from shared.store.logs import Logs
from shared.store.org_secrets import OrgSecrets
from shared.store.projects import Datasets, Projects
from shared.store.runs import Runs
from shared.store.slots import ActiveSlots
from shared.store.tables import Table
from shared.store.throughput import Throughput
from shared.store.watch import WatchIndex

TABLES = ("connections", "catalogs", "projects", "datasets", "runs", "events", "logs", "ledger", "audit",
          "secrets", "quotas", "watch", "leases", "sweeps", "throughput", "keys",
          "webhooks", "ended", "hubmodels")


class Store:
    def __init__(self, connection_string: str, prefix: str) -> None:
        from azure.data.tables import TableServiceClient

        self._service = service_client(TableServiceClient, "table", connection_string, **storage_client_kwargs())
        self.prefix = prefix
        self._tables = {n: Table(self._service, f"{prefix}{n}") for n in TABLES}
        t = self.table
        self.watch = WatchIndex(t("watch"))
        self.runs = Runs(t("runs"), self.watch, ended=self._run_ended)
        self.slots = ActiveSlots(t("quotas"), self.runs)
        self.events = Events(t("events"), t("quotas"))
        self.logs = Logs(t("logs"))
        self.ledger = Ledger(t("ledger"))
        self.audit = Audit(t("audit"))
        self.connections = Connections(t("connections"))
        self.secrets = OrgSecrets(t("secrets"))
        self.catalogs = Catalogs(t("catalogs"))
        self.projects = Projects(t("projects"))
        self.datasets = Datasets(t("datasets"))
        self.throughput = Throughput(t("throughput"))
        self.ended = EndedIndex(t("ended"))
        self.hub_models = HubModels(t("hubmodels"))

    def table(self, name: str) -> Table:
        return self._tables[name]

    def _run_ended(self, org: str, run_id: str) -> None:
        self.slots.release(org, run_id)  # Runs.mutate has ended the run: its active-run slot is free
        # Its history (events, logs) is pruned once the org's retention has passed (timers/prune_history.py).
        # A crash before this line leaves that run's history kept: never more deleted than asked.
        self.ended.add(org, run_id, now_ts())


_override: Store | None = None


@lru_cache(maxsize=1)  # one client per process, built on first use
def _default_store() -> Store:
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
