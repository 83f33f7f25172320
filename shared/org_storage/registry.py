"""Build the storage backend for a saved storage config; SDKs load only when used."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from pydantic import BaseModel, TypeAdapter

from shared.errors import InvalidInput, PermanentError
from shared.models import ORG_PATTERN
from shared.org_storage.base import StorageBackend
from shared.org_storage.config import LocalStorageConfig, RunPodVolumeConfig, S3StorageConfig, StorageConfig
from shared.org_storage.local import LocalStorage
from shared.org_storage.runpod_volume import RunPodVolumeStorage
from shared.org_storage.s3 import S3Storage
from shared.settings import Settings

STORAGE_ADAPTER: TypeAdapter[StorageConfig] = TypeAdapter(StorageConfig)


def parse_storage_config(data: object) -> BaseModel:
    result: BaseModel = STORAGE_ADAPTER.validate_python(data)
    return result


# Storage kinds that exist only outside production: local storage is a directory on the
# control plane's own host.
DEV_ONLY_KINDS = frozenset({"local"})


def storage_kinds(settings: Settings) -> list[str]:
    """The storage kinds this deployment offers (the OpenAPI and the save check derive from it)."""
    return [str(m.model_fields["kind"].default) for m in storage_config_models(settings)]


def storage_config_models(settings: Settings) -> list[type[BaseModel]]:
    members: tuple[type[BaseModel], ...] = get_args(get_args(StorageConfig)[0])
    return [m for m in members if not (settings.is_production and m.model_fields["kind"].default in DEV_ONLY_KINDS)]


def refuse_unavailable_storage(kind: str, settings: Settings) -> None:
    """422 naming the kind when it does not exist in this deployment."""
    if settings.is_production and kind in DEV_ONLY_KINDS:
        raise InvalidInput.field("kind", f"{kind} storage exists only outside production (it is a directory on the "
                                 f"control plane's own host); use one of {', '.join(storage_kinds(settings))}")


def make_storage(config: BaseModel, settings: Settings, org: str) -> StorageBackend:
    if isinstance(config, LocalStorageConfig):
        if settings.is_production:  # a row saved before production: never the production host's disk
            raise PermanentError("local storage exists only outside production; save another storage connection")

        # The org names a directory: no "..", "/" or "\\"; fullmatch, as "$" allows a trailing newline.
        if not re.fullmatch(ORG_PATTERN, org):
            raise ValueError(f"org {org!r:.80} is not a valid organization id")
        return LocalStorage(config, Path(settings.local_root).resolve() / "storage" / org)
    if isinstance(config, S3StorageConfig):
        return S3Storage(config)
    if isinstance(config, RunPodVolumeConfig):
        return RunPodVolumeStorage(config)
    raise TypeError(f"no storage backend for {type(config).__name__}")
