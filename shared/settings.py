"""One Settings object, read from app settings (environment variables).

Azure Functions exposes app settings as environment variables, and the local host
loads local.settings.json's Values into the environment, so both paths meet here.
"""

from __future__ import annotations

import base64
import os
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
    "QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;"
    "TableEndpoint=http://127.0.0.1:10002/devstoreaccount1;"
)
# Development-only defaults: the local host refuses to use them when TENSORANT_ENV=production.
DEV_JWT_SECRET = "dev-only-jwt-secret-change-me-0123456789abcdef"
DEV_ENCRYPTION_KEY = base64.b64encode(b"dev-only-aes-key-32-bytes-long!!").decode()


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str = "development"
    storage_connection: str = AZURITE
    deployment_id: str = Field(default="dev", pattern=r"^[a-z0-9][a-z0-9-]{1,30}$")
    table_prefix: str = "ta"
    queue_prefix: str = ""
    jwt_secret: str = DEV_JWT_SECRET
    encryption_key: str = DEV_ENCRYPTION_KEY
    public_url: str = "http://localhost:7071"
    local_root: str = ".tensorant"
    trainer_command: str = ""
    container_image: str = "ghcr.io/tensorant/trainer:2026.11"
    # Time limits the control plane enforces itself (never a provider-side timer).
    provisioning_timeout_s: int = 1800
    heartbeat_timeout_s: int = 600
    default_runtime_limit_s: int = 3600
    sweep_grace_s: int = 300
    release_backoff_max_s: int = 900
    catalog_max_age_s: int = 3600

    @property
    def encryption_key_bytes(self) -> bytes:
        key = base64.b64decode(self.encryption_key)
        if len(key) != 32:
            raise ValueError("TENSORANT_ENCRYPTION_KEY must be 32 bytes, base64-encoded")
        return key


_ENV = {
    "env": "TENSORANT_ENV",
    "storage_connection": "AzureWebJobsStorage",
    "deployment_id": "TENSORANT_DEPLOYMENT_ID",
    "table_prefix": "TENSORANT_TABLE_PREFIX",
    "queue_prefix": "TENSORANT_QUEUE_PREFIX",
    "jwt_secret": "TENSORANT_JWT_SECRET",
    "encryption_key": "TENSORANT_ENCRYPTION_KEY",
    "public_url": "TENSORANT_PUBLIC_URL",
    "local_root": "TENSORANT_LOCAL_ROOT",
    "trainer_command": "TENSORANT_TRAINER_COMMAND",
    "container_image": "TENSORANT_CONTAINER_IMAGE",
    "provisioning_timeout_s": "TENSORANT_PROVISIONING_TIMEOUT_S",
    "heartbeat_timeout_s": "TENSORANT_HEARTBEAT_TIMEOUT_S",
    "default_runtime_limit_s": "TENSORANT_DEFAULT_RUNTIME_LIMIT_S",
    "sweep_grace_s": "TENSORANT_SWEEP_GRACE_S",
    "release_backoff_max_s": "TENSORANT_RELEASE_BACKOFF_MAX_S",
    "catalog_max_age_s": "TENSORANT_CATALOG_MAX_AGE_S",
}


def load_settings() -> Settings:
    values = {field: os.environ[var] for field, var in _ENV.items() if os.environ.get(var)}
    if values.get("storage_connection") == "UseDevelopmentStorage=true":
        values["storage_connection"] = AZURITE
    settings = Settings(**values)  # type: ignore[arg-type]
    if settings.env == "production" and DEV_JWT_SECRET in (settings.jwt_secret,):
        raise ValueError("TENSORANT_JWT_SECRET must be set in production")
    if settings.env == "production" and settings.encryption_key == DEV_ENCRYPTION_KEY:
        raise ValueError("TENSORANT_ENCRYPTION_KEY must be set in production")
    return settings


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()


def reset_settings() -> None:
    get_settings.cache_clear()
