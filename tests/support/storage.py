"""Emptying a test's queues and dropping its tables (on Azurite, between tests and benches)."""

from __future__ import annotations

from shared.queues import Queue, Queues
from shared.store.repo import TABLES, Store


def clear_queues(queues: Queues) -> None:
    """Every step's queue and its poison queue, emptied."""
    for q in Queue:
        for name in (q.value, q.poison):
            queues.client(name).clear_messages()


def drop_tables(store: Store) -> None:
    """Delete the store's tables (its table prefix's)."""
    for name in TABLES:
        table = store.table(name)
        table.client.delete_table()
        table._client = None  # a later use of this store creates the table again
