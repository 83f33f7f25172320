"""A run's machine and its connection's scope: never lose sight of a held machine.

A run's machine lives in the scope its connection had at launch (RunRecord.scope: the AWS account
and region, the Azure subscription, resource group and region, the RunPod account). A connection
re-saved into another scope would release, retain and sweep in the wrong place: "not found" there
reads as "already gone", the run ends and the machine bills on. So a save that changes the scope
is refused while any run holds a machine or disk, new credentials for the same scope must show
they see every held machine, and release/retain/the sweeper refuse to act across scopes.

Each compute connection (`aws`, `aws/us-west-2`: one account and region each) has its own scope:
the functions here take a connection's name and judge only the runs launched through it.

Also here: what happens to the runs holding machines when a provider rejects the saved credentials
outside a check (the sweeper's listing).
"""

from __future__ import annotations

from pydantic import BaseModel

from shared.clock import now
from shared.context import Context
from shared.errors import Conflict, PermanentError, ProviderError
from shared.log import redact_text
from shared.models import Check, CheckStatus, ConnectionStatus, MachineState, RunRecord, RunState
from shared.providers import registry
from shared.providers.base import ComputeProvider, scope_differs, scope_of
from shared.runs.events import event
from shared.runs.org_backends import (
    compute_connection_slot,
    compute_for,
    provider_of,
    ref_of,
    run_connection,
    with_storage_context,
)


def runs_holding_machines(ctx: Context, org: str, connection: str) -> list[RunRecord]:
    """The org's runs holding a machine or disk made through the compute connection `connection`."""
    # A queued run has no machine yet (launch writes provisioning before any cloud call).
    return [r for r in ctx.store.runs.active(org) if run_connection(r) == connection and r.state != RunState.queued]


def scope_text(scope: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(scope.items())) or "an unknown scope"


def runs_text(runs: list[RunRecord]) -> str:
    shown = ", ".join(f"{r.id} ({r.state.value})" for r in runs[:10])
    return shown + (f" and {len(runs) - 10} more" if len(runs) > 10 else "")


def held_problems(ctx: Context, org: str, connection: str, new: ComputeProvider,
                  held: list[RunRecord]) -> tuple[dict[str, tuple[str, str]], list[RunRecord], list[str]]:
    """(scope changes, runs in another scope, runs whose machine the new connection cannot see: why)."""
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
                    legacy = scope_of(compute_for(ctx, org, connection))
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
            desc = new.describe(ref_of(ctx, run), list(run.resources))
        except ProviderError as exc:
            unseen.append(f"{run.id} ({run.state.value}): {redact_text(exc.reason)}")
            continue
        if run.resources and desc.state == MachineState.gone:
            unseen.append(f"{run.id} ({run.state.value}): its machine "
                          f"{', '.join(r.id.rsplit('/', 1)[-1] for r in run.resources[:3])} is not visible")
    return changes, moved, unseen


def guard_held_machines(ctx: Context, org: str, connection: str, config: BaseModel) -> None:
    """Refuse (409) a compute connection save that would lose sight of a machine or disk a run holds."""
    held = runs_holding_machines(ctx, org, connection)
    if not held:
        return
    provider = provider_of(connection)
    try:
        new = registry.make_compute(provider, with_storage_context(ctx, provider, config, org), ctx.settings)
        changes, moved, unseen = held_problems(ctx, org, connection, new, held)
    except ProviderError as exc:
        raise Conflict(f"nothing was saved: runs {runs_text(held)} hold {connection} machines or disks, and the "
                       f"new credentials could not be checked against them ({redact_text(exc.reason)}); fix the "
                       "credentials, or release or cancel those runs first") from exc
    if moved:
        what = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in sorted(changes.items()))
        raise Conflict(f"nothing was saved: the connection would move to another scope ({what}) while runs "
                       f"{runs_text(moved)} hold machines or disks in the old one, which the new connection could "
                       "neither see nor delete. Release or cancel those runs first (recover an adapter you need, "
                       "then cancel with discard: true to release the machine and disk) and wait until they are "
                       "released; or keep the scope and only replace the credentials")
    if unseen:
        raise Conflict(f"nothing was saved: the new credentials cannot see the machines of runs {'; '.join(unseen)}. "
                       "Use credentials of an identity that can still see and manage the existing machines "
                       "(same account and permissions), or release or cancel those runs first")


def held_machines_check(ctx: Context, org: str, connection: str, provider: ComputeProvider) -> list[Check]:
    """The connection check's part: do these credentials see every machine a run holds?"""
    held = runs_holding_machines(ctx, org, connection)
    if not held:
        return []
    try:
        changes, moved, unseen = held_problems(ctx, org, connection, provider, held)
    except ProviderError as exc:
        return [Check(name="held machines", status=CheckStatus.fail,
                      message=f"could not check the machines runs {runs_text(held)} hold: {exc.reason}")]
    if moved or unseen:
        problems = [f"runs {runs_text(moved)} were launched in another scope "
                    f"({'; '.join(f'{k} {a}, now {b}' for k, (a, b) in sorted(changes.items()))})"] if moved else []
        problems += [f"cannot see the machine of run {u}" for u in unseen]
        return [Check(name="held machines", status=CheckStatus.fail,
                      message="; ".join(problems) + ". Save credentials that see them again, or release or "
                              "cancel those runs in their own scope")]
    return [Check(name="held machines", status=CheckStatus.ok,
                  message=f"the credentials see the machines of every run that holds one: {runs_text(held)}")]


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
            f"refusing to act in another scope: run {run.id}'s machine was created in {scope_text(run.scope)}, "
            f"but the {run_connection(run)} connection now points elsewhere ({what}); there it would find nothing and "
            "leave the machine billing. Save the connection back to that scope (credentials that see the machine), "
            "then retry", code="ScopeChanged")


def report_credential_failure(ctx: Context, org: str, connection: str, reason: str) -> list[str]:
    """The provider rejected the saved credentials outside a check (a key revoked or expired
    while runs hold machines). Mark the connection failed and warn on every run that holds a
    machine, since cleanup and recovery cannot work until an owner replaces the key.
    Returns the ids of the warned runs."""
    store = ctx.store
    slot = compute_connection_slot(connection)
    got = store.connections.get(org, slot)
    if got is not None and got[0].status != ConnectionStatus.failed:
        check = Check(name="credentials", status=CheckStatus.fail,
                      message=f"the provider rejected the saved credentials: {reason}; replace them (save the "
                              "connection again with a working key)")
        store.connections.put(got[0].model_copy(update={
            "status": ConnectionStatus.failed, "checks": [check, *got[0].checks], "checked_at": now()}), got[1])
    warned = []
    for run in store.runs.active(org):
        if run_connection(run) == connection:
            event(ctx, run, "warning", f"the {connection} credentials no longer work ({reason}): this run's machine and "
                                  "disk cannot be stopped, recovered or deleted until an owner replaces them")
            warned.append(run.id)
    return warned
