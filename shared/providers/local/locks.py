"""The local provider's file lock: shared.trainer.locks.file_lock (moved there so the training image,
which has shared/trainer but not shared/providers, holds it too)."""

from __future__ import annotations

from shared.trainer.locks import file_lock

__all__ = ["file_lock"]
