"""Build the storage backend for a saved storage config; SDKs load only when used."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, TypeAdapter

from shared.models import ORG_PATTERN
from shared.settings import Settings
from shared.storage.base import StorageBackend
from shared.storage.config import LocalStorageConfig, RunPodVolumeConfig, S3StorageConfig, StorageConfig

STORAGE_ADAPTER: TypeAdapter[StorageConfig] = TypeAdapter(StorageConfig)


def parse_storage_config(data: object) -> BaseModel:
    result: BaseModel = STORAGE_ADAPTER.validate_python(data)
    return result


def make_storage(config: BaseModel, settings: Settings, org: str) -> StorageBackend:
    if isinstance(config, LocalStorageConfig):
        from shared.storage.local import LocalStorage

        # The org names a directory: no "..", "/" or "\\"; fullmatch, as "$" allows a trailing newline.
        if not re.fullmatch(ORG_PATTERN, org):
            raise ValueError(f"org {org!r:.80} is not a valid organization id")
        return LocalStorage(config, Path(settings.local_root).resolve() / "storage" / org)
    if isinstance(config, S3StorageConfig):
        from shared.storage.s3 import S3Storage

        return S3Storage(config)
    if isinstance(config, RunPodVolumeConfig):
        from shared.storage.runpod_volume import RunPodVolumeStorage

        return RunPodVolumeStorage(config)
    raise TypeError(f"no storage backend for {type(config).__name__}")
