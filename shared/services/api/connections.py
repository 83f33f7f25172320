"""Saving, showing and checking an organization's compute and storage connections.

A compute connection is one account and one region, named `{provider}` (the default, under
/api/connections/compute/{provider}) or `{provider}/{name}` (beside it, under
/api/connections/compute/{provider}/named/{name}); each is saved, checked, priced and deleted on its own.

Saving validates the fields at once (a clear error naming the field), seals the
secrets, stores the connection as `checking` and queues validate-connection; the
checks run there and never create anything billable.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError

from shared.clock import now
from shared.context import Context
from shared.errors import ConcurrencyError, Conflict, InvalidInput, NotFound, ProviderError, invalid
from shared.models import ConnectionMessage, ConnectionRecord, ConnectionStatus, ConnectionView, Role
from shared.org_storage.registry import (
    make_storage,
    parse_storage_config,
    refuse_unavailable_storage,
    storage_config_models,
)
from shared.providers import registry
from shared.runs.org_backends import (
    STORAGE_SLOT,
    check_connection_name,
    compute_connection_slot,
    compute_for,
    connection_of_slot,
    provider_of,
    run_connection,
    unsealed_config,
)
from shared.runs.scope import guard_held_machines
from shared.security import Principal, require, seal
from shared.services.api import quotas
from shared.steps import Step


def view(rec: ConnectionRecord) -> ConnectionView:
    name = connection_of_slot(rec.slot) if rec.slot.startswith("compute:") else ""
    return ConnectionView(slot=rec.slot, provider=rec.provider, name=name, status=rec.status, config=rec.config,
                          checks=rec.checks, warnings=rec.warnings, saved_at=rec.saved_at, checked_at=rec.checked_at)


# The wire form of a secret left unchanged: omitted, or sent back as the API shows it ({"set": true}).
KEEP_SECRET = {"set": True}


def _keep_existing_secrets(body: dict[str, Any], model: type[BaseModel], existing: BaseModel | None) -> dict[str, Any]:
    """Secrets are write-only: a save that omits one, or sends back the shown {"set": true}, keeps the
    stored value (a form re-saved unchanged must not need the secret typed again)."""
    merged = dict(body)
    same = existing is not None and type(existing) is model
    for name in model.model_fields:
        if name in merged and merged[name] != KEEP_SECRET:
            continue
        value = getattr(existing, name) if same else None
        if isinstance(value, SecretStr) and value.get_secret_value():
            merged[name] = value.get_secret_value()
        elif name in merged:
            raise InvalidInput.field(name, "no saved secret to keep (nothing saved yet, or the connection's kind "
                                           "changed): enter the value")
    return merged


def _config_warnings(config: BaseModel) -> list[str]:
    fn = getattr(config, "warnings", None)
    return list(fn()) if callable(fn) else []


# A save is read, then written with the read's ETag; a check that records its verdict in between (a re-save
# right after a save meets the first save's check) makes the write fail: the save is made again on the new read.
SAVE_TRIES = 4


def _save(ctx: Context, principal: Principal, slot: str, provider: str, config: BaseModel, location: str = "") -> ConnectionView:
    store = ctx.store
    for attempt in range(SAVE_TRIES):
        got = store.connections.get(principal.org, slot)
        rec = ConnectionRecord(
            org=principal.org, slot=slot, provider=provider, status=ConnectionStatus.checking,
            config=registry.public_config(config),
            sealed=seal(registry.sealed_config(config), aad=f"{principal.org}|{slot}"),
            location=location, warnings=_config_warnings(config), saved_at=now(),
            revision=(got[0].revision + 1) if got else 1,
        )
        try:
            store.connections.put(rec, got[1] if got else None)
            break
        except ConcurrencyError:
            if attempt == SAVE_TRIES - 1:
                raise
    ctx.queues.send(Step.validate_connection, ConnectionMessage(org=principal.org, slot=slot))
    return view(rec)


def connection_name(provider: str, name: str | None = None) -> str:
    """The connection a route names: `{provider}` (the default), or `{provider}/{name}`; 422 naming the
    field when either part is not a name."""
    if name is None:
        return check_connection_name(provider, field="provider")
    if "/" in provider:
        raise InvalidInput.field("provider", "is a provider name (aws, azure, runpod, local), without '/'")
    return check_connection_name(f"{provider}/{name}", field="name")


def save_compute(ctx: Context, principal: Principal, name: str, body: Any) -> ConnectionView:
    """Save the compute connection `name` (`aws`, the default; `aws/us-west-2`, a named one)."""
    require(principal, Role.owner)
    provider = provider_of(name)
    if not isinstance(body, dict):
        raise InvalidInput.field("body", "send the connection fields as a JSON object")
    registry.refuse_unavailable(provider)  # `local` runs code on this host: only outside production
    info = registry.info_of(provider)
    for retired, advice in (info.retired_fields if info else {}).items():
        if retired in body:
            raise InvalidInput.field(retired, advice)
    model = registry.config_model(provider)
    got = ctx.store.connections.get(principal.org, compute_connection_slot(name))
    existing = unsealed_config(got[0]) if got else None
    try:
        config = model.model_validate(_keep_existing_secrets(body, model, existing))
    except ValidationError as exc:
        raise invalid(exc) from exc
    guard_held_machines(ctx, principal.org, name, config)
    return _save(ctx, principal, compute_connection_slot(name), provider, config)


def save_storage(ctx: Context, principal: Principal, body: Any) -> ConnectionView:
    require(principal, Role.owner)
    if not isinstance(body, dict) or "kind" not in body:
        raise InvalidInput.field("kind", "say which storage: \"local\", \"s3\" or \"runpod_volume\"")
    refuse_unavailable_storage(str(body["kind"]), ctx.settings)  # local storage (this host's disk) is dev-only
    got = ctx.store.connections.get(principal.org, STORAGE_SLOT)
    existing = unsealed_config(got[0]) if got else None
    models = {str(m.model_fields["kind"].default): m for m in storage_config_models(ctx.settings)}
    try:
        model = models.get(str(body["kind"]))
        config = parse_storage_config(_keep_existing_secrets(body, model, existing) if model else body)
    except ValidationError as exc:
        raise invalid(exc) from exc
    location = make_storage(config, ctx.settings, principal.org).location()
    if got and got[0].location != location and ctx.store.projects.in_org(principal.org):
        raise Conflict(
            f"storage location cannot change once the organization has projects (saved: {_shown(got[0].location)}, "
            f"new: {_shown(location)}); rotating credentials for the same location is allowed; moving existing data "
            "needs a migration"
        )
    return _save(ctx, principal, STORAGE_SLOT, str(body["kind"]), config, location)


def _shown(location: str) -> str:
    # A local directory's location is a path on the control plane's host: not the caller's business.
    return "the control plane's local storage directory" if location.startswith("file:") else location


def get_one(ctx: Context, principal: Principal, slot: str) -> ConnectionView:
    got = ctx.store.connections.get(principal.org, slot)
    if not got:
        raise NotFound(f"no {slot} connection is saved")
    return view(got[0])


def list_all(ctx: Context, principal: Principal) -> dict[str, Any]:
    return {"items": [view(r) for r in ctx.store.connections.in_org(principal.org)]}


def delete_compute(ctx: Context, principal: Principal, name: str) -> None:
    require(principal, Role.owner)
    slot = compute_connection_slot(name)
    if not ctx.store.connections.get(principal.org, slot):
        raise NotFound(f"no {slot} connection is saved")
    holding = [r.id for r in ctx.store.runs.active(principal.org) if run_connection(r) == name]
    if holding:
        raise Conflict(f"runs {', '.join(holding[:5])} still hold {name} machines; release or recover them first, "
                       "or the control plane could not clean them up")
    ctx.store.connections.delete(principal.org, slot)


def request_check(ctx: Context, principal: Principal, name: str) -> ConnectionView:
    require(principal, Role.owner)
    slot = compute_connection_slot(name)
    got = ctx.store.connections.get(principal.org, slot)
    if not got:
        raise NotFound(f"no {slot} connection is saved")
    quotas.take(ctx, principal, "check")  # each check calls the cloud with the org's credentials
    ctx.queues.send(Step.validate_connection, ConnectionMessage(org=principal.org, slot=slot))
    return view(got[0])


def runpod_volumes(ctx: Context, principal: Principal) -> dict[str, Any]:
    """The network volumes of the account of the provider that lists them (declared lists_network_volumes:
    RunPod), so an owner can pick one for storage."""
    require(principal, Role.owner)
    [info] = [i for i in registry.providers().values() if i.lists_network_volumes]  # the route names the one there is
    provider = compute_for(ctx, principal.org, info.name)
    list_volumes = getattr(provider, "network_volumes", None)
    if list_volumes is None:  # a test override of the provider that lacks the method
        raise NotFound(info.network_volumes_refusal.format(provider=info.name))
    try:
        return {"items": list_volumes()}
    except ProviderError as exc:
        raise Conflict(f"{info.shown} did not list the volumes: {exc.reason}; enter the volume ID and datacenter "
                       "ID instead") from exc
