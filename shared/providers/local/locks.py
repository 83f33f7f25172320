"""The local provider's file lock: machine.trainer.locks.file_lock (moved there so the training image,
which has machine/trainer but not shared/providers, holds it too)."""

from __future__ import annotations

from machine.trainer.locks import file_lock

__all__ = ["file_lock"]
