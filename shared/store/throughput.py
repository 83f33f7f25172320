"""Measured throughput for forecasts: one row per (org, provider, base model, GPU, precision settings),
the last measured tokens per second, written when a run's final adapter is verified with the
trainer's figures, read by the forecast of a like run (shared/runs/forecast.py). One point read,
whatever the org's history."""

from __future__ import annotations

from typing import Any

from shared.store.keys import org_key
from shared.store.tables import Table


class Throughput:
    def __init__(self, table: Table) -> None:
        self._table = table

    def get(self, org: str, key: str) -> dict[str, Any] | None:
        got = self._table.get(org_key(org), key)
        return got[0] if got else None

    def put(self, org: str, key: str, data: dict[str, Any]) -> None:
        self._table.upsert(org_key(org), key, data)
