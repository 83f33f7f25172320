"""An org's backends, built from its saved connections: the compute provider per cloud, the
storage backend, and the reference by which providers know a run.

Connections are saved in slots: `storage`, and `compute:<name>` per compute connection, where the
name is `{provider}` (the provider's default connection, the only one before names existed) or
`{provider}/{name}` (another account or region of the same provider: one connection is one account
and one region). Their sealed configuration is opened here, and every secret in it is registered
for log redaction.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from shared.context import Context
from shared.errors import Conflict, InvalidInput
from shared.log import register_secret
from shared.models import CONNECTION_PATTERN, ConnectionRecord, ConnectionStatus, RunRecord
from shared.org_storage.base import StorageBackend
from shared.org_storage.registry import make_storage, parse_storage_config
from shared.providers import registry
from shared.providers.base import ComputeProvider, RunRef
from shared.runs import provider_cache
from shared.runs.candidates import attempt_no, provider_of, run_connection
from shared.security import unseal
from shared.store.installation import installation_id

STORAGE_SLOT = "storage"


_CONNECTION = re.compile(CONNECTION_PATTERN)


def compute_connection_slot(name: str) -> str:
    """The slot of the compute connection `name` (`aws`, `aws/us-west-2`)."""
    return f"compute:{name}"


def connection_of_slot(slot: str) -> str:
    """A compute slot's connection name (`compute:aws/us-west-2` -> `aws/us-west-2`)."""
    return slot.removeprefix("compute:")


def check_connection_name(name: str, field: str = "connection", provider: str | None = None) -> str:
    """422 naming `field` unless `name` is a connection name of a provider this deployment offers (and,
    given `provider`, of that one). Returns the name."""
    if not isinstance(name, str) or not _CONNECTION.fullmatch(name):
        raise InvalidInput.field(field, f"{str(name)[:80]!r} is not a connection name: use `{{provider}}` (the default "
                                 "connection, e.g. aws) or `{provider}/{name}` (e.g. aws/us-west-2; the name is "
                                 "lowercase letters, digits and '-', at most 40)")
    if provider is not None and provider_of(name) != provider:
        raise InvalidInput.field(field, f"{name!r} is a {provider_of(name)} connection, not {provider}: name one of "
                                 f"{provider} (e.g. {provider} or {provider}/<name>), or change provider")
    registry.refuse_unavailable(provider_of(name))
    return name


def unsealed_config(rec: ConnectionRecord) -> BaseModel:
    data = unseal(rec.sealed, aad=f"{rec.org}|{rec.slot}")
    config = parse_storage_config(data) if rec.slot == STORAGE_SLOT else registry.config_model(rec.provider).model_validate(data)
    for secret in registry.secret_values(config):
        register_secret(secret)
    return config


def storage_config(ctx: Context, org: str) -> BaseModel | None:
    got = ctx.store.connections.get(org, STORAGE_SLOT)
    return unsealed_config(got[0]) if got else None


def route_of(name: str) -> str:
    """The API path (under /api/) of the compute connection `name`."""
    provider, _, sub = name.partition("/")
    return f"connections/compute/{provider}" + (f"/named/{sub}" if sub else "")


def compute_for(ctx: Context, org: str, name: str, *, require_connected: bool = False) -> ComputeProvider:
    """The provider of the org's compute connection `name` (`aws`, the default; `aws/us-west-2`)."""
    got = ctx.store.connections.get(org, compute_connection_slot(name))
    if not got:
        raise Conflict(f"no {name} compute connection is saved; an owner saves it under {route_of(name)}")
    rec = got[0]
    if require_connected and rec.status != ConnectionStatus.connected:
        raise Conflict(f"the {name} connection is {rec.status.value}; fix its failed checks first")
    return compute_of(ctx, rec)


def compute_of(ctx: Context, rec: ConnectionRecord) -> ComputeProvider:
    """The compute provider of a saved connection already read (the account sweep reads it once); reused
    while the connection (and, for a provider that reads it, the storage connection) is the same version
    (shared/runs/provider_cache.py), so its SDK clients are built once per process, not per invocation."""
    settings = ctx.settings
    if registry.overridden(rec.provider):
        return _build(ctx, rec)[0]
    key = provider_cache.version_of(rec)
    if registry.has_prepare_config(rec.provider):
        got = ctx.store.connections.get(rec.org, STORAGE_SLOT)
        key += provider_cache.version_of(got[0] if got else None)
    return provider_cache.get((*key, id(settings)), settings, lambda: _build(ctx, rec))


def _build(ctx: Context, rec: ConnectionRecord) -> tuple[ComputeProvider, list[str]]:
    opened = unsealed_config(rec)
    config = with_storage_context(ctx, rec.provider, opened, rec.org)
    return registry.make_compute(rec.provider, config, ctx.settings), registry.secret_values(opened)


def with_storage_context(ctx: Context, provider: str, config: BaseModel, org: str) -> BaseModel:
    """The config with what the provider takes from the org's storage connection (its registry
    entry's prepare_config hook: RunPod pins pods to the org's network volume)."""
    return registry.prepare_config(provider, config, lambda: storage_config(ctx, org))


def storage_for(ctx: Context, org: str) -> StorageBackend:
    config = storage_config(ctx, org)
    if config is None:
        raise Conflict("no storage connection is saved; an owner saves one with `tensorant connections "
                       "save-storage --set kind=local` (this host's disk, for development) or `tensorant connections "
                       "save-storage --from-file storage.json` (cloud storage; `--help` has an example)")
    return make_storage(config, ctx.settings, org)


def ref_of(ctx: Context, run: RunRecord, attempt: int | None = None) -> RunRef:
    """How providers find and mark the run's resources (this deployment, the org, the run, and the launch
    attempt: the current one's unless `attempt` names an earlier one, shared/runs/candidates.py)."""
    n = attempt_no(run) if attempt is None else attempt
    return RunRef(deployment=ctx.settings.deployment_id, org=run.org, run_id=run.id, store=installation_id(ctx),
                  connection=run_connection(run), attempt=n)
