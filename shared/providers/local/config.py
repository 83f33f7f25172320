"""What a user saves for the local provider (no secrets, no SDK).

The trainer command is an operator setting (TENSORANT_TRAINER_COMMAND), never per org: an
owner could otherwise run any shell command on the control plane's host.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Saved by older versions; dropped when a stored row is read (saves refuse it, see connections.py).
REMOVED_FIELDS = ("trainer_command",)


class LocalConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    price_per_hour: float = Field(default=0.0, ge=0.0, le=1000.0, description=(
        "What an hour of this host counts as in costs and usage (0: free)"))

    @model_validator(mode="before")
    @classmethod
    def _drop_removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(k in data for k in REMOVED_FIELDS):
            return {k: v for k, v in data.items() if k not in REMOVED_FIELDS}
        return data
