"""An org's backends, built from its saved connections: the compute provider per cloud, the
storage backend, and the reference by which providers know a run.

Connections are saved in slots: `storage`, and `compute:<provider>` per cloud. Their sealed
configuration is opened here, and every secret in it is registered for log redaction.
"""

from __future__ import annotations

from pydantic import BaseModel

from shared.errors import Conflict
from shared.log import register_secret
from shared.models import ConnectionRecord, ConnectionStatus, RunRecord
from shared.org_storage.base import StorageBackend
from shared.org_storage.registry import make_storage, parse_storage_config
from shared.providers import registry
from shared.providers.base import ComputeProvider, RunRef
from shared.runs import provider_cache
from shared.security import unseal
from shared.settings import Settings, get_settings
from shared.store import get_store

STORAGE_SLOT = "storage"


def compute_connection_slot(provider: str) -> str:
    return f"compute:{provider}"


def unsealed_config(rec: ConnectionRecord) -> BaseModel:
    data = unseal(rec.sealed, aad=f"{rec.org}|{rec.slot}")
    config = parse_storage_config(data) if rec.slot == STORAGE_SLOT else registry.config_model(rec.provider).model_validate(data)
    for secret in registry.secret_values(config):
        register_secret(secret)
    return config


def storage_config(org: str) -> BaseModel | None:
    got = get_store().connections.get(org, STORAGE_SLOT)
    return unsealed_config(got[0]) if got else None


def compute_for(org: str, provider: str, *, require_connected: bool = False) -> ComputeProvider:
    got = get_store().connections.get(org, compute_connection_slot(provider))
    if not got:
        raise Conflict(f"no {provider} compute connection is saved; an owner saves it under connections/compute/{provider}")
    rec = got[0]
    if require_connected and rec.status != ConnectionStatus.connected:
        raise Conflict(f"the {provider} connection is {rec.status.value}; fix its failed checks first")
    return compute_of(rec)


def compute_of(rec: ConnectionRecord) -> ComputeProvider:
    """The compute provider of a saved connection already read (the account sweep reads it once); reused
    while the connection (and, for a provider that reads it, the storage connection) is the same version
    (shared/runs/provider_cache.py), so its SDK clients are built once per process, not per invocation."""
    settings = get_settings()
    if registry.overridden(rec.provider):
        return _build(rec, settings)[0]
    key = provider_cache.version_of(rec)
    if registry.has_prepare_config(rec.provider):
        got = get_store().connections.get(rec.org, STORAGE_SLOT)
        key += provider_cache.version_of(got[0] if got else None)
    return provider_cache.get((*key, id(settings)), settings, lambda: _build(rec, settings))


def _build(rec: ConnectionRecord, settings: Settings) -> tuple[ComputeProvider, list[str]]:
    opened = unsealed_config(rec)
    config = with_storage_context(rec.provider, opened, rec.org)
    return registry.make_compute(rec.provider, config, settings), registry.secret_values(opened)


def with_storage_context(provider: str, config: BaseModel, org: str) -> BaseModel:
    """The config with what the provider takes from the org's storage connection (its registry
    entry's prepare_config hook: RunPod pins pods to the org's network volume)."""
    return registry.prepare_config(provider, config, lambda: storage_config(org))


def storage_for(org: str) -> StorageBackend:
    config = storage_config(org)
    if config is None:
        raise Conflict("no storage connection is saved; an owner saves one with `tensorant connections "
                       "save-storage --set kind=local` (this host's disk, for development) or `tensorant connections "
                       "save-storage --from-file storage.json` (cloud storage; `--help` has an example)")
    return make_storage(config, get_settings(), org)


def ref_of(run: RunRecord) -> RunRef:
    """How providers find and mark the run's resources (this deployment, the org, the run)."""
    from shared.store.installation import installation_id

    return RunRef(deployment=get_settings().deployment_id, org=run.org, run_id=run.id, store=installation_id())
