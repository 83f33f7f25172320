"""What a user saves for the local provider (no secrets, no SDK)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LocalConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    price_per_hour: float = Field(default=0.0, ge=0.0, le=1000.0)
    # Shell command the agent runs as the trainer; empty = settings.trainer_command, or the real LoRA trainer.
    trainer_command: str = Field(default="", max_length=2000)
