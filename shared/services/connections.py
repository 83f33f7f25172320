"""Saving, showing and checking an organization's compute and storage connections.

Saving validates the fields at once (a clear error naming the field), seals the
secrets, stores the connection as `checking` and queues validate-connection; the
checks run there and never create anything billable.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError

from shared.clock import now
from shared.errors import Conflict, InvalidInput, NotFound
from shared.http import invalid
from shared.log import get_logger, redact_text
from shared.models import (
    CatalogRecord,
    Check,
    CheckStatus,
    ConnectionMessage,
    ConnectionRecord,
    ConnectionStatus,
    ConnectionView,
    MachineState,
    Role,
    RunRecord,
    RunState,
)
from shared.providers import registry
from shared.providers.base import ComputeProvider, scope_differs, scope_of
from shared.providers.errors import PermanentError, ProviderError
from shared.queues import get_queues
from shared.runs.lifecycle import HOLDS_MACHINE
from shared.runs.steps import Step
from shared.security import Principal, require, seal
from shared.services import quotas
from shared.services.backends import STORAGE_SLOT, compute_slot, storage_for, unsealed_config
from shared.settings import get_settings
from shared.storage.registry import make_storage, parse_storage_config, refuse_unavailable_storage
from shared.store import get_store


def view(rec: ConnectionRecord) -> ConnectionView:
    return ConnectionView(slot=rec.slot, provider=rec.provider, status=rec.status, config=rec.config,
                          checks=rec.checks, warnings=rec.warnings, saved_at=rec.saved_at, checked_at=rec.checked_at)


def _keep_existing_secrets(body: dict[str, Any], model: type[BaseModel], existing: BaseModel | None) -> dict[str, Any]:
    """Secrets are write-only: a save that omits one keeps the stored value."""
    if existing is None or type(existing) is not model:
        return body
    merged = dict(body)
    for name in model.model_fields:
        value = getattr(existing, name)
        if isinstance(value, SecretStr) and name not in merged:
            merged[name] = value.get_secret_value()
    return merged


def _config_warnings(config: BaseModel) -> list[str]:
    fn = getattr(config, "warnings", None)
    return list(fn()) if callable(fn) else []


def _save(principal: Principal, slot: str, provider: str, config: BaseModel, location: str = "") -> ConnectionView:
    store = get_store()
    got = store.get_connection(principal.org, slot)
    rec = ConnectionRecord(
        org=principal.org, slot=slot, provider=provider, status=ConnectionStatus.checking,
        config=registry.public_config(config),
        sealed=seal(registry.sealed_config(config), aad=f"{principal.org}|{slot}"),
        location=location, warnings=_config_warnings(config), saved_at=now(),
        revision=(got[0].revision + 1) if got else 1,
    )
    store.put_connection(rec, got[1] if got else None)
    get_queues().send(Step.validate_connection, ConnectionMessage(org=principal.org, slot=slot))
    return view(rec)


def save_compute(principal: Principal, provider: str, body: Any) -> ConnectionView:
    require(principal, Role.owner)
    if not isinstance(body, dict):
        raise InvalidInput.field("body", "send the connection fields as a JSON object")
    registry.refuse_unavailable(provider)  # 11.1: `local` exists only outside production
    if provider == "local" and "trainer_command" in body:
        raise InvalidInput.field("trainer_command", "the trainer command is an operator setting "
                                 "(TENSORANT_TRAINER_COMMAND), not part of a connection; remove the field")
    model = registry.config_model(provider)
    got = get_store().get_connection(principal.org, compute_slot(provider))
    existing = unsealed_config(got[0]) if got else None
    try:
        config = model.model_validate(_keep_existing_secrets(body, model, existing))
    except ValidationError as exc:
        raise invalid(exc) from exc
    guard_held_machines(principal.org, provider, config)
    return _save(principal, compute_slot(provider), provider, config)


def save_storage(principal: Principal, body: Any) -> ConnectionView:
    require(principal, Role.owner)
    if not isinstance(body, dict) or "kind" not in body:
        raise InvalidInput.field("kind", "say which storage: \"local\", \"s3\" or \"runpod_volume\"")
    refuse_unavailable_storage(str(body["kind"]), get_settings())  # 11.1: local storage is dev-only
    got = get_store().get_connection(principal.org, STORAGE_SLOT)
    existing = unsealed_config(got[0]) if got else None
    try:
        config = parse_storage_config(body)
        config = parse_storage_config(_keep_existing_secrets(body, type(config), existing))
    except ValidationError as exc:
        raise invalid(exc) from exc
    location = make_storage(config, get_settings(), principal.org).location()
    if got and got[0].location != location and get_store().list_projects(principal.org):
        raise Conflict(
            f"storage location cannot change once the organization has projects (saved: {_shown(got[0].location)}, "
            f"new: {_shown(location)}); rotating credentials for the same location is allowed; moving existing data "
            "needs a migration"
        )
    return _save(principal, STORAGE_SLOT, str(body["kind"]), config, location)


def _shown(location: str) -> str:
    # A local directory's location is a path on the control plane's host: not the caller's business.
    return "the control plane's local storage directory" if location.startswith("file:") else location


def get_one(principal: Principal, slot: str) -> ConnectionView:
    got = get_store().get_connection(principal.org, slot)
    if not got:
        raise NotFound(f"no {slot} connection is saved")
    return view(got[0])


def list_all(principal: Principal) -> dict[str, Any]:
    return {"items": [view(r) for r in get_store().list_connections(principal.org)]}


def delete_compute(principal: Principal, provider: str) -> None:
    require(principal, Role.owner)
    slot = compute_slot(provider)
    if not get_store().get_connection(principal.org, slot):
        raise NotFound(f"no {slot} connection is saved")
    holding = [r.id for r in get_store().list_runs(principal.org, HOLDS_MACHINE) if r.provider == provider]
    if holding:
        raise Conflict(f"runs {', '.join(holding[:5])} still hold {provider} machines; release or recover them first, "
                       "or the control plane could not clean them up")
    get_store().delete_connection(principal.org, slot)


def request_check(principal: Principal, provider: str) -> ConnectionView:
    require(principal, Role.owner)
    slot = compute_slot(provider)
    got = get_store().get_connection(principal.org, slot)
    if not got:
        raise NotFound(f"no {slot} connection is saved")
    quotas.take(principal, "check")  # each check calls the cloud with the org's credentials
    get_queues().send(Step.validate_connection, ConnectionMessage(org=principal.org, slot=slot))
    return view(got[0])


# ------------------------------------------------------------------ the validate-connection step


def _run_checks(rec: ConnectionRecord) -> tuple[list[Check], CatalogRecord | None]:
    from shared.services.backends import compute_for

    if rec.slot == STORAGE_SLOT:
        return storage_for(rec.org).validate(), None
    provider = compute_for(rec.org, rec.provider)
    checks = list(provider.validate())
    checks.extend(held_machines_check(rec.org, rec.provider, provider))
    catalog = None
    if not any(c.status == CheckStatus.fail for c in checks):
        try:
            offers = provider.offers()
            catalog = CatalogRecord(org=rec.org, provider=rec.provider, offers=offers, fetched_at=now())
            checks.append(Check(name="catalog", status=CheckStatus.ok if offers else CheckStatus.fail,
                                message=f"{len(offers)} supported GPU offers priced" if offers else
                                "no supported GPU offer is available with this setup; see the checks above"))
        except ProviderError as exc:
            checks.append(Check(name="catalog", status=CheckStatus.fail, message=f"the catalog did not load: {exc.reason}"))
    return checks, catalog


def validate_connection(msg: ConnectionMessage) -> None:
    """The validate-connection step: run the checks, record each result on the connection."""
    org, slot = msg.org, msg.slot
    store = get_store()
    got = store.get_connection(org, slot)
    if not got:
        return  # deleted since the message was sent
    rec, _ = got
    try:
        checks, catalog = _run_checks(rec)
    except ProviderError as exc:
        checks, catalog = [Check(name="connection", status=CheckStatus.fail, message=exc.reason)], None
    except Exception as exc:  # a check must report, not crash the step into poison
        get_logger().exception("connection check crashed")
        checks, catalog = [Check(name="connection", status=CheckStatus.fail,
                                 message=f"the check could not run: {redact_text(str(exc))}")], None
    status = ConnectionStatus.failed if any(c.status == CheckStatus.fail for c in checks) else ConnectionStatus.connected
    if catalog is not None:
        store.put_catalog(catalog)
    current = store.get_connection(org, slot)
    if current is None or current[0].revision != rec.revision:
        return  # saved again meanwhile: that save's own check reports
    store.put_connection(current[0].model_copy(update={"status": status, "checks": checks, "checked_at": now()}),
                         current[1])


def runpod_volumes(principal: Principal) -> dict[str, Any]:
    """The RunPod account's network volumes, so an owner can pick one for storage."""
    from shared.services.backends import compute_for

    require(principal, Role.owner)
    provider = compute_for(principal.org, "runpod")
    list_volumes = getattr(provider, "network_volumes", None)
    if list_volumes is None:
        raise NotFound("this provider cannot list network volumes")
    try:
        return {"items": list_volumes()}
    except ProviderError as exc:
        raise Conflict(f"RunPod did not list the volumes: {exc.reason}; enter the volume ID and datacenter "
                       "ID instead") from exc


def report_credential_failure(org: str, provider: str, reason: str) -> list[str]:
    """The provider rejected the saved credentials outside a check (a key revoked or expired
    while runs hold machines). Mark the connection failed and warn on every run that holds a
    machine, since cleanup and recovery cannot work until an owner replaces the key.
    Returns the ids of the warned runs."""
    from shared.services.run_events import event

    store = get_store()
    slot = compute_slot(provider)
    got = store.get_connection(org, slot)
    if got is not None and got[0].status != ConnectionStatus.failed:
        check = Check(name="credentials", status=CheckStatus.fail,
                      message=f"the provider rejected the saved credentials: {reason}; replace them (save the "
                              "connection again with a working key)")
        store.put_connection(got[0].model_copy(update={
            "status": ConnectionStatus.failed, "checks": [check, *got[0].checks], "checked_at": now()}), got[1])
    warned = []
    for run in store.list_runs(org, HOLDS_MACHINE):
        if run.provider == provider:
            event(run, "warning", f"the {provider} credentials no longer work ({reason}): this run's machine and "
                                  "disk cannot be stopped, recovered or deleted until an owner replaces them")
            warned.append(run.id)
    return warned


# ------------------------------------------------------------------ scope: never lose sight of a held machine
#
# A run's machine lives in the scope its connection had at launch (RunRecord.scope: the AWS account
# and region, the Azure subscription, resource group and region, the RunPod account). A connection
# re-saved into another scope would release, retain and sweep in the wrong place: "not found" there
# reads as "already gone", the run ends and the machine bills on. So a save that changes the scope
# is refused while any run holds a machine or disk, new credentials for the same scope must show
# they see every held machine, and release/retain/the sweeper refuse to act across scopes.


def _holding(org: str, provider: str) -> list[RunRecord]:
    # A queued run has no machine yet (launch writes provisioning before any cloud call).
    return [r for r in get_store().list_runs(org, HOLDS_MACHINE) if r.provider == provider and r.state != RunState.queued]


def _scope_text(scope: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(scope.items())) or "an unknown scope"


def _runs_text(runs: list[RunRecord]) -> str:
    shown = ", ".join(f"{r.id} ({r.state.value})" for r in runs[:10])
    return shown + (f" and {len(runs) - 10} more" if len(runs) > 10 else "")


def _held_problems(org: str, provider_name: str, new: ComputeProvider,
                   held: list[RunRecord]) -> tuple[dict[str, tuple[str, str]], list[RunRecord], list[str]]:
    """(scope changes, runs in another scope, runs whose machine the new connection cannot see: why)."""
    from shared.services.backends import compute_for, ref_of

    new_scope = scope_of(new)  # may raise ProviderError: the caller reports it
    legacy: dict[str, str] | None = None  # runs launched before scopes were recorded: the saved connection's
    changes: dict[str, tuple[str, str]] = {}
    moved: list[RunRecord] = []
    unseen: list[str] = []
    for run in held:
        recorded = run.scope
        if not recorded:
            if legacy is None:
                try:
                    legacy = scope_of(compute_for(org, provider_name))
                except Exception:  # the old credentials may be the broken ones: compare nothing
                    legacy = {}
            recorded = legacy
        diff = scope_differs(recorded, new_scope)
        if diff:
            changes.update(diff)
            moved.append(run)
            continue
        # Same scope: the new credentials must see the machine (describe is a read).
        try:
            desc = new.describe(ref_of(run), list(run.resources))
        except ProviderError as exc:
            unseen.append(f"{run.id} ({run.state.value}): {redact_text(exc.reason)}")
            continue
        if run.resources and desc.state == MachineState.gone:
            unseen.append(f"{run.id} ({run.state.value}): its machine "
                          f"{', '.join(r.id.rsplit('/', 1)[-1] for r in run.resources[:3])} is not visible")
    return changes, moved, unseen


def guard_held_machines(org: str, provider_name: str, config: BaseModel) -> None:
    """Refuse (409) a compute connection save that would lose sight of a machine or disk a run holds."""
    from shared.services.backends import with_storage_context

    held = _holding(org, provider_name)
    if not held:
        return
    try:
        new = registry.make_compute(provider_name, with_storage_context(provider_name, config, org), get_settings())
        changes, moved, unseen = _held_problems(org, provider_name, new, held)
    except ProviderError as exc:
        raise Conflict(f"nothing was saved: runs {_runs_text(held)} hold {provider_name} machines or disks, and the "
                       f"new credentials could not be checked against them ({redact_text(exc.reason)}); fix the "
                       "credentials, or release or cancel those runs first") from exc
    if moved:
        what = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in sorted(changes.items()))
        raise Conflict(f"nothing was saved: the connection would move to another scope ({what}) while runs "
                       f"{_runs_text(moved)} hold machines or disks in the old one, which the new connection could "
                       "neither see nor delete. Release or cancel those runs first (recover an adapter you need, "
                       "then cancel with discard: true to release the machine and disk) and wait until they are "
                       "released; or keep the scope and only replace the credentials")
    if unseen:
        raise Conflict(f"nothing was saved: the new credentials cannot see the machines of runs {'; '.join(unseen)}. "
                       "Use credentials of an identity that can still see and manage the existing machines "
                       "(same account and permissions), or release or cancel those runs first")


def held_machines_check(org: str, provider_name: str, provider: ComputeProvider) -> list[Check]:
    """The connection check's part: do these credentials see every machine a run holds?"""
    held = _holding(org, provider_name)
    if not held:
        return []
    try:
        changes, moved, unseen = _held_problems(org, provider_name, provider, held)
    except ProviderError as exc:
        return [Check(name="held machines", status=CheckStatus.fail,
                      message=f"could not check the machines runs {_runs_text(held)} hold: {exc.reason}")]
    if moved or unseen:
        problems = [f"runs {_runs_text(moved)} were launched in another scope "
                    f"({'; '.join(f'{k} {a}, now {b}' for k, (a, b) in sorted(changes.items()))})"] if moved else []
        problems += [f"cannot see the machine of run {u}" for u in unseen]
        return [Check(name="held machines", status=CheckStatus.fail,
                      message="; ".join(problems) + ". Save credentials that see them again, or release or "
                              "cancel those runs in their own scope")]
    return [Check(name="held machines", status=CheckStatus.ok,
                  message=f"the credentials see the machines of every run that holds one: {_runs_text(held)}")]


def refuse_other_scope(run: RunRecord, provider: ComputeProvider) -> None:
    """Raise PermanentError(code="ScopeChanged") when the connection no longer points where the run's
    machine was created: acting there would release or retain nothing and leave it billing."""
    if not run.scope:
        return  # launched before scopes were recorded: nothing to compare
    try:
        current = scope_of(provider)
    except ProviderError:
        return  # the action itself reaches the cloud and reports its own error
    diff = scope_differs(run.scope, current)
    if diff:
        what = "; ".join(f"{k} {a}, now {b}" for k, (a, b) in sorted(diff.items()))
        raise PermanentError(
            f"refusing to act in another scope: run {run.id}'s machine was created in {_scope_text(run.scope)}, "
            f"but the {run.provider} connection now points elsewhere ({what}); there it would find nothing and "
            "leave the machine billing. Save the connection back to that scope (credentials that see the machine), "
            "then retry", code="ScopeChanged")
