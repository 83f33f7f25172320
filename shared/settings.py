"""One Settings object, read from app settings (environment variables).

Azure Functions exposes app settings as environment variables, and the local host
loads local.settings.json's Values into the environment, so both paths meet here.
"""

from __future__ import annotations

import base64
import binascii
import os
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, field_validator

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
    "QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;"
    "TableEndpoint=http://127.0.0.1:10002/devstoreaccount1;"
)
# Development-only defaults: published here, so production refuses them (production_problems).
DEV_JWT_SECRET = "dev-only-jwt-secret-change-me-0123456789abcdef"
DEV_ENCRYPTION_KEY = base64.b64encode(b"dev-only-aes-key-32-bytes-long!!").decode()
# The placeholders in local.settings.example.json: copied as they are, they are no secret.
EXAMPLE_JWT_SECRET = "replace-with-a-long-random-secret"
EXAMPLE_ENCRYPTION_KEY = "replace-with-base64-of-32-random-bytes"
MIN_JWT_SECRET_BYTES = 32
PRODUCTION_USER_TOKEN_MAX_TTL_S = 24 * 3600
DEV_USER_TOKEN_MAX_TTL_S = 10 * 366 * 86400  # `tensorant dev-token` mints long-lived dev tokens
AGENT_TOKEN_MAX_TTL_S = 8 * 24 * 3600
ENVIRONMENTS = ("production", "development", "test")


class Settings(BaseModel):
    """Every app setting, with its default and the one line that README's table shows.

    `make settings-doc` writes README's settings table and local.settings.example.json from this
    class, _ENV, SHOWN_DEFAULTS and EXAMPLE_VALUES; tests/test_settings_doc.py fails when they differ.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str = Field(default="development", description=(
        "`production`, `development` or `test` (any case; anything else is refused at start); production "
        "refuses development defaults and test-only allowances"))
    storage_connection: str = Field(default=AZURITE, description=(
        "the Azure Storage account of the queues and tables; `UseDevelopmentStorage=true` is Azurite"))
    # No hyphen: names are `tensorant-<deployment>-<run>`, and with hyphens one deployment's
    # prefix could begin another's (`test` and `test-b`), so its pods would look like ours.
    deployment_id: str = Field(default="dev", pattern=r"^[a-z0-9]{2,31}$", description=(
        "2-31 lowercase letters and digits (no hyphen: it is part of machine names); written into every "
        "ownership tag; the sweeper touches only this deployment's resources"))
    table_prefix: str = Field(default="ta", description=(
        "put before every table's name (the tests give each session its own tables with it)"))
    jwt_secret: str = Field(default=DEV_JWT_SECRET, description=(
        "HS256 secret of user and agent tokens, at least 32 bytes (required in production)"))
    # Rotation: tokens are minted with the current secret only, so the previous one is needed
    # just until every token signed with it has expired.
    jwt_secret_previous: str = Field(default="", description=(
        "rotation: the secret before the current one, still accepted; an agent on it gets a token on the new "
        "key at its next heartbeat. Unset it after a day (user tokens live 24 h)"))
    encryption_key: str = Field(default=DEV_ENCRYPTION_KEY, description=(
        "base64 of 32 random bytes: the AES-GCM key sealing connection secrets (required in production)"))
    public_url: str = Field(default="http://localhost:7071", description=(
        "the URL the agents on the machines send heartbeats to; unset in Azure: https://<WEBSITE_HOSTNAME>, "
        "the site's default host name"))
    local_root: str = Field(default=".tensorant", description=(
        "the local provider's machine directories, local storage and converted models"))
    trainer_command: str = Field(default="", description=(
        "the trainer the agent runs, for every org (tests: the smoke trainer); unset: the machine's own, "
        "the real LoRA trainer"))
    container_image: str = Field(default="ghcr.io/tensorant/trainer:2026.11", description=(
        "the training image cloud machines run (or a private registry's copy of it)"))
    # Time limits the control plane enforces itself (never a provider-side timer).
    # 15 min covers a VM's boot and a cold pull of the training image (1.5 GB with the CPU torch as
    # `make image-check` builds it; about 6-7 GB with PyPI's CUDA torch, a few minutes at cloud
    # registry speeds) with a wide margin; a failed pull reports itself sooner.
    provisioning_timeout_s: int = Field(default=900, ge=120, description=(
        "the boot deadline, launch to the agent's first report (at least 120); a machine that misses it never "
        "trained, so it is released, not retained"))
    heartbeat_timeout_s: int = Field(default=600, description=(
        "an agent silent this long has its run retained (machine stopped, disk kept)"))
    default_runtime_limit_s: int = Field(default=3600, description=(
        "the runtime limit of a full run that names none, unless its forecast needs more; past it the run "
        "is retained"))
    sweep_grace_s: int = Field(default=300, description="the sweeper leaves anything younger than this alone")
    release_backoff_max_s: int = Field(default=900, description=(
        "the longest wait between two attempts to release a run's machine (doubling from 15 s)"))
    catalog_max_age_s: int = Field(default=3600, description=(
        "a provider's offer catalog older than this is refreshed when it is read"))
    user_token_max_ttl_s: int = Field(default=0, ge=0, description=(
        "the longest user token accepted (exp - iat); 0: 24 h in production, 10 years elsewhere "
        "(`tensorant dev-token`)"))
    # moto and local S3 servers listen on loopback over http; production refuses to start with it.
    allow_private_endpoints: bool = Field(default=False, description=(
        "tests only (production refuses it): a custom S3 endpoint or a webhook URL may be http:// on a loopback or "
        "private address"))
    # The test models are random weights built on the machine; a real cloud machine would ask the
    # hub for them and get 404.
    allow_test_models: bool = Field(default=False, description=(
        "tests only (production refuses it): cloud runs may name the `tensorant/*` test models and pass the "
        "smoke trainer's adapter"))
    # Base models named by Hub id (shared/runs/hub_models.py): config.json and the safetensors index are read here,
    # through the same endpoint guard as other outbound URLs (https, public addresses).
    hf_endpoint: str = Field(default="https://huggingface.co", max_length=200, description=(
        "the Hugging Face hub the control plane reads a base model's config.json from (a mirror's URL where the hub "
        "is not reachable)"))
    # GPU billing resumed when the machine started.
    recovery_idle_stop_s: int = Field(default=3600, ge=60, description=(
        "a retained machine started for recovery is stopped again after this long, with a warning event"))
    # The first token also covers the boot deadline (an image pull comes before the first heartbeat).
    agent_token_ttl_s: int = Field(default=2 * 3600, ge=300, le=AGENT_TOKEN_MAX_TTL_S, description=(
        "an agent token's lifetime (300 s to 8 days), renewed through heartbeats"))
    # Operator ceilings (DESIGN: every per-organization limit has a deployment-wide one): an owner sets
    # the org's limits under them only, so no org can take the capacity that protects the others.
    org_max_active_runs_ceiling: int = Field(default=50, ge=1, le=1000, description=(
        "the most max_active_runs any organization may have (its owner sets a value up to it)"))
    org_runs_per_minute_ceiling: int = Field(default=30, ge=1, le=1000, description=(
        "the most runs_per_minute any organization may have; the heavy routes (uploads, recoveries, checks, "
        "metrics) are limited by the same value"))
    org_max_price_ceiling: float = Field(default=1000.0, gt=0, le=1000, description=(
        "the most max_price_limit_per_hour any organization may have"))
    org_max_runtime_ceiling_s: int = Field(default=7 * 24 * 3600, ge=60, le=7 * 24 * 3600, description=(
        "the most max_runtime_limit_s any organization may have"))
    org_retention_ceiling_s: int = Field(default=365 * 24 * 3600, ge=24 * 3600, le=365 * 24 * 3600, description=(
        "the most retention_limit_s any organization may have"))
    org_max_capacity_wait_ceiling_s: int = Field(default=7 * 24 * 3600, ge=0, le=7 * 24 * 3600, description=(
        "the most max_capacity_wait_s any organization may have"))

    @field_validator("env")
    @classmethod
    def _env(cls, v: str) -> str:
        # "Production" must not skip the production checks, and a misspelling ("prod", a zero-width
        # space) must not silently mean development: only the known names are accepted.
        name = v.strip().lower()
        if name not in ENVIRONMENTS:
            raise ValueError(f"TENSORANT_ENV must be one of {', '.join(ENVIRONMENTS)}, not {v!r}")
        return name

    @field_validator("jwt_secret", "jwt_secret_previous", "encryption_key", "storage_connection")
    @classmethod
    def _resolved(cls, v: str) -> str:
        # App Service leaves a Key Vault reference as is when it cannot resolve it (no access, a
        # wrong name): used as a secret, the reference text itself would become the key.
        if v.strip().startswith("@Microsoft.KeyVault("):
            raise ValueError("a Key Vault reference was not resolved (the app's identity cannot read the secret, "
                             "or the reference is wrong): fix it in the app settings")
        return v

    @property
    def is_production(self) -> bool:
        return self.env == "production"

    @property
    def user_token_max_ttl(self) -> int:
        if self.user_token_max_ttl_s:
            return self.user_token_max_ttl_s
        return PRODUCTION_USER_TOKEN_MAX_TTL_S if self.is_production else DEV_USER_TOKEN_MAX_TTL_S

    @property
    def encryption_key_bytes(self) -> bytes:
        try:
            key = base64.b64decode(self.encryption_key, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != 32:
            raise ValueError("TENSORANT_ENCRYPTION_KEY must be 32 random bytes, base64-encoded")
        return key


_ENV = {
    "env": "TENSORANT_ENV",
    "storage_connection": "AzureWebJobsStorage",
    "deployment_id": "TENSORANT_DEPLOYMENT_ID",
    "table_prefix": "TENSORANT_TABLE_PREFIX",
    "jwt_secret": "TENSORANT_JWT_SECRET",
    "jwt_secret_previous": "TENSORANT_JWT_SECRET_PREVIOUS",
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
    "user_token_max_ttl_s": "TENSORANT_USER_TOKEN_MAX_TTL_S",
    "allow_private_endpoints": "TENSORANT_ALLOW_PRIVATE_ENDPOINTS",
    "allow_test_models": "TENSORANT_ALLOW_TEST_MODELS",
    "hf_endpoint": "TENSORANT_HF_ENDPOINT",
    "recovery_idle_stop_s": "TENSORANT_RECOVERY_IDLE_STOP_S",
    "agent_token_ttl_s": "TENSORANT_AGENT_TOKEN_TTL_S",
    "org_max_active_runs_ceiling": "TENSORANT_ORG_MAX_ACTIVE_RUNS_CEILING",
    "org_runs_per_minute_ceiling": "TENSORANT_ORG_RUNS_PER_MINUTE_CEILING",
    "org_max_price_ceiling": "TENSORANT_ORG_MAX_PRICE_CEILING",
    "org_max_runtime_ceiling_s": "TENSORANT_ORG_MAX_RUNTIME_CEILING_S",
    "org_retention_ceiling_s": "TENSORANT_ORG_RETENTION_CEILING_S",
    "org_max_capacity_wait_ceiling_s": "TENSORANT_ORG_MAX_CAPACITY_WAIT_CEILING_S",
}
# What README's table says for a default that is not worth printing (a connection string, a public
# development secret); every other default is printed as it is.
SHOWN_DEFAULTS = {
    "storage_connection": "Azurite",
    "jwt_secret": "dev value",
    "encryption_key": "dev value",
}
# What local.settings.example.json holds where a copied default would mislead: placeholders for the
# secrets (production refuses them, so a copied example is never a deployment's key), and the short
# form of the emulator's connection string that the Functions tools write.
EXAMPLE_VALUES = {
    "storage_connection": "UseDevelopmentStorage=true",
    "jwt_secret": EXAMPLE_JWT_SECRET,
    "encryption_key": EXAMPLE_ENCRYPTION_KEY,
}


def _check_tables() -> None:
    # A field without an environment name could never be set; one without a description would
    # leave a blank line in README's table.
    fields = Settings.model_fields
    problems = [f"{name}: no environment name in _ENV" for name in fields if name not in _ENV]
    problems += [f"{name}: in _ENV but not a setting" for name in _ENV if name not in fields]
    problems += [f"{name}: no description" for name, info in fields.items() if not info.description]
    problems += [f"{name}: not a setting" for name in (*SHOWN_DEFAULTS, *EXAMPLE_VALUES) if name not in fields]
    if problems:
        raise RuntimeError("shared/settings.py: " + "; ".join(problems))


_check_tables()


def environment_names() -> dict[str, str]:
    """Each setting's field name and the environment variable (app setting) it is read from."""
    return dict(_ENV)


PLATFORM_HOST_NAME = "WEBSITE_HOSTNAME"


def load_settings() -> Settings:
    values = {field: os.environ[var] for field, var in _ENV.items() if os.environ.get(var)}
    if "public_url" not in values and os.environ.get(PLATFORM_HOST_NAME):
        # In Azure the platform sets the site's defaultHostName here; the template sets no URL of its own
        # (infra/controlplane/main.bicep: a setting cannot read its own site's defaultHostName).
        values["public_url"] = "https://" + os.environ[PLATFORM_HOST_NAME].strip().rstrip("/")
    if values.get("storage_connection") == "UseDevelopmentStorage=true":
        values["storage_connection"] = AZURITE
    settings = Settings(**values)  # type: ignore[arg-type]
    if settings.is_production:
        problems = production_problems(settings)
        if problems:
            raise ValueError("refusing to start in production: " + "; ".join(problems))
    return settings


def production_problems(s: Settings) -> list[str]:
    """What makes these settings unsafe for production (never echoing a secret)."""
    problems = []
    if s.jwt_secret in (DEV_JWT_SECRET, EXAMPLE_JWT_SECRET):
        problems.append("TENSORANT_JWT_SECRET is the development default or the example placeholder; "
                        "set a random secret")
    elif len(s.jwt_secret.encode()) < MIN_JWT_SECRET_BYTES:
        problems.append(f"TENSORANT_JWT_SECRET is shorter than {MIN_JWT_SECRET_BYTES} bytes")
    if s.jwt_secret_previous and (s.jwt_secret_previous in (DEV_JWT_SECRET, EXAMPLE_JWT_SECRET)
                                  or len(s.jwt_secret_previous.encode()) < MIN_JWT_SECRET_BYTES):
        problems.append("TENSORANT_JWT_SECRET_PREVIOUS is a default, a placeholder or shorter than "
                        f"{MIN_JWT_SECRET_BYTES} bytes")
    if s.encryption_key in (DEV_ENCRYPTION_KEY, EXAMPLE_ENCRYPTION_KEY):
        problems.append("TENSORANT_ENCRYPTION_KEY is the development default or the example placeholder")
    else:
        try:
            _ = s.encryption_key_bytes
        except ValueError as exc:
            problems.append(str(exc))
    if s.allow_private_endpoints:
        problems.append("TENSORANT_ALLOW_PRIVATE_ENDPOINTS is a test-only allowance")
    if s.allow_test_models:
        problems.append("TENSORANT_ALLOW_TEST_MODELS is a test-only allowance")
    if s.user_token_max_ttl > PRODUCTION_USER_TOKEN_MAX_TTL_S:
        problems.append(f"TENSORANT_USER_TOKEN_MAX_TTL_S may be at most {PRODUCTION_USER_TOKEN_MAX_TTL_S}")
    if not s.public_url.startswith("https://"):
        # Agents send their run token and logs there, and the bootstrap script its report: never in clear text.
        problems.append("TENSORANT_PUBLIC_URL must be an https:// URL in production (agents send their tokens to it)")
    return problems


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()


def reset_settings() -> None:
    get_settings.cache_clear()
