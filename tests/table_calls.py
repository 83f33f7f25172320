"""Counting the store's table calls (the `calls` fixture, tests/conftest.py): what a request costs on the
tables, for the hot-path tests (tests/test_heartbeat_cost.py, tests/test_scale.py). The calls still go through."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

WRITES = ("insert", "update", "upsert", "delete")
READS = ("get", "query", "pages")


class Calls:
    """Counts every call on every table of the store: (table, method) -> n."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.kwargs: list[tuple[str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def take(self) -> Counter[tuple[str, str]]:
        with self.lock:
            out, self.counts = self.counts, Counter()
            self.kwargs = []
            return out

    def writes(self, counts: Counter[tuple[str, str]]) -> int:
        return sum(n for (_, m), n in counts.items() if m in WRITES)

    def reads(self, counts: Counter[tuple[str, str]]) -> int:
        return sum(n for (_, m), n in counts.items() if m in READS)


def counting_calls() -> Iterator[Calls]:
    """Wrap every table of the current store to count its calls, for one test (a fixture's body)."""
    from shared.store import get_store

    rec = Calls()
    undo: list[Callable[[], None]] = []
    store = get_store()
    for name in ("runs", "events", "logs", "ledger", "audit", "connections", "catalogs", "projects", "datasets"):
        table = store.table(name)
        for method in WRITES + READS:
            real = getattr(table, method)

            def counted(*args: Any, _real: Any = real, _key: tuple[str, str] = (name, method), **kw: Any) -> Any:
                with rec.lock:
                    rec.counts[_key] += 1
                    rec.kwargs.append((*_key, kw))
                return _real(*args, **kw)

            setattr(table, method, counted)
            undo.append(functools.partial(delattr, table, method))
    yield rec
    for u in undo:
        u()
