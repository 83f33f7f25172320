"""Base models named by Hub id and revision: what the control plane derived from each one's config.json,
read once per org, id and revision (shared/runs/hub_models.py). Keyed by org: a private or gated model is
read with the org's own token, so its shapes are that org's to see."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from adapter_format.base_models import DeclaredModel
from shared.store.keys import org_key, row_key
from shared.store.tables import Table

_FIELDS = {f.name for f in fields(DeclaredModel)}


def _key(model_id: str, revision: str) -> str:
    return row_key(f"{model_id}@{revision}")


class HubModels:
    def __init__(self, table: Table) -> None:
        self._table = table

    def get(self, org: str, model_id: str, revision: str) -> tuple[DeclaredModel, dict[str, Any]] | None:
        got = self._table.get(org_key(org), _key(model_id, revision))
        if not got:
            return None
        data = got[0]
        shapes = {k: v for k, v in data.get("model", {}).items() if k in _FIELDS}
        shapes["default_targets"] = tuple(shapes.get("default_targets", ()))
        return DeclaredModel(**shapes), {k: v for k, v in data.items() if k != "model"}

    def put(self, org: str, model_id: str, revision: str, model: DeclaredModel, **extra: Any) -> None:
        self._table.upsert(org_key(org), _key(model_id, revision),
                           {"model_id": model_id, "revision": revision, "model": asdict(model), **extra})
