"""The GPU price catalog per connection, as the API shows it and runs choose from it: the cached
offers with their time; a stale catalog queues a refresh (shared/services/steps/refresh_catalog.py).
A run records its price at launch; a later refresh never rewrites it. A run's offer is looked up in the
same cache by admission (shared/runs/admission.py, find_offer).
"""

from __future__ import annotations

from typing import Any

from shared.clock import now
from shared.context import Context
from shared.errors import NotFound
from shared.models import ConnectionMessage, GpuOffer, TrainingSettings
from shared.providers import registry
from shared.runs import admission
from shared.runs.org_backends import check_connection_name, compute_connection_slot, connection_of_slot, provider_of
from shared.security import Principal
from shared.steps import Step


def offers_view(ctx: Context, principal: Principal, provider: str | None, base_model: str | None = None,
                connection: str | None = None) -> dict[str, Any]:
    """The cached offers (of one `connection`, of every connection of one `provider`, or of all the
    org's compute connections); each names its connection. With base_model, each offer says whether
    it `fits` a LoRA run of that model at the default training settings, and the `memory_needed_gb`."""
    model = admission.declared(ctx, base_model) if base_model else None
    store = ctx.store
    if connection:
        check_connection_name(connection, provider=provider or None)  # 422 naming `connection`
        slots = [compute_connection_slot(connection)]
    elif provider:
        registry.refuse_unavailable(provider)  # no `local` offers in production: it runs code on this host
        named = sorted(r.slot for r in store.connections.in_org(principal.org)
                       if r.slot.startswith(compute_connection_slot(provider + "/")))
        slots = [compute_connection_slot(provider), *named]
        if store.connections.get(principal.org, slots[0]) is None and named:
            slots = named  # only named connections of this provider: their offers, no default to name
    else:
        slots = [r.slot for r in store.connections.in_org(principal.org) if r.slot.startswith("compute:")
                 and registry.available(provider_of(connection_of_slot(r.slot)))]
    items: list[GpuOffer] = []
    catalogs: list[dict[str, Any]] = []
    for slot in slots:
        name = connection_of_slot(slot)
        if store.connections.get(principal.org, slot) is None:
            raise NotFound(f"no {name} compute connection is saved; an owner saves it with "
                           f"{_save_command(name)}, then the catalog fills in")
        rec = store.catalogs.get(principal.org, name)
        max_age = ctx.settings.catalog_max_age_s
        stale = rec is None or rec.fetched_at is None or (now() - rec.fetched_at).total_seconds() > max_age
        if stale:
            ctx.queues.send(Step.refresh_catalog, ConnectionMessage(org=principal.org, slot=slot))
        if rec:
            items.extend(o.model_copy(update={"connection": name}) for o in rec.offers)  # older rows lack it
        catalogs.append({"provider": provider_of(name), "connection": name, "fetched_at": rec.fetched_at if rec else None,
                         "last_error": rec.last_error if rec else "", "refreshing": stale})
    shown: list[Any] = list(items)
    if model is not None:
        defaults = TrainingSettings()
        shown = []
        for offer in items:
            f = admission.listed_fit(model, offer, defaults)
            shown.append({**offer.model_dump(mode="json"), "fits": f.fits, "memory_needed_gb": f.memory_needed_gb,
                          **({"fit_note": f.why} if f.why else {})})
    return {"items": shown, "catalogs": catalogs,
            "note": "Prices are on-demand compute plus the job's disk per hour; network, data transfer, "
                    "taxes and discounts are not included."}


def _save_command(provider: str) -> str:
    """The command that saves the connection: no file to name when every field has a default (local),
    else a JSON file of the fields the user writes (no such file exists until they do)."""
    required = [n for n, f in registry.config_model(provider_of(provider)).model_fields.items() if f.is_required()]
    if not required:
        return f"`tensorant connections save-compute {provider}`"
    return (f"`tensorant connections save-compute {provider} --from-file {provider_of(provider)}.json` (a JSON file you write "
            f"with {', '.join(required)}; `tensorant connections save-compute --help` has an example)")
