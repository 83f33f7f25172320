"""A run request's candidates, checked at create (and at a draft's edit) each as the single offer is:
the provider connected, the offer in its connection's catalog, the model fits its GPU, the price under
the run's limit, the org's storage reachable from it. One that fails is a 422 naming it
(`candidates[i]`) and why, never dropped silently. `fallback: "fitting"` adds every offer of the org's
connected accounts that passes the same checks, cheapest forecast cost first (a faster GPU can cost less
in all), then cheapest price, up to MAX_CANDIDATES in all.
"""

from __future__ import annotations

from collections.abc import Callable

from adapter_format.base_models import DeclaredModel
from shared.errors import InvalidInput
from shared.models import (
    MAX_CANDIDATES,
    CandidateRequest,
    ConnectionStatus,
    DatasetVersionRecord,
    GpuOffer,
    RunCandidate,
    RunCreate,
    TrainingSettings,
)
from shared.org_storage.config import RunPodVolumeConfig
from shared.providers.registry import declaration
from shared.runs import forecast
from shared.runs.org_backends import check_connection_name, compute_connection_slot, provider_of, route_of, storage_config
from shared.services.api import base_models
from shared.services.api.catalog import cached_offers, find_offer
from shared.store import get_store


def check_fit(org: str, provider: str, offer: GpuOffer, model: DeclaredModel, training: TrainingSettings) -> None:
    """422 on offer_id when the offer cannot hold the model at these settings, with the offers that can."""
    got = base_models.fit(model, offer, training)
    if got.fits:
        return
    eligible = [o.offer_id for o in cached_offers(org, provider) if base_models.fit(model, o, training).fits]
    if eligible:
        choose = f"offers that fit: {', '.join(eligible[:20])}"
    elif (cpu := declaration(offer.provider).trains_on_cpu) and not base_models.fits_cpu(model, cpu):
        choose = cpu.size_advice.format(model=model.name, provider=offer.provider, max_b=cpu.max_params / 1e9)
    else:
        choose = f"no {provider} offer fits; lower batch_size or max_seq_len, or set load_in_4bit"
    raise InvalidInput(f"offer_id: {got.why}; {choose}", errors=[{
        "field": "offer_id", "message": got.why, "memory_needed_gb": got.memory_needed_gb,
        "eligible_offer_ids": eligible}])


def check_provider(org: str, provider: str, field: str = "provider") -> None:
    """`provider`: a provider, or a compute connection's name (`aws/us-west-2`: its provider is checked)."""
    from shared.providers import registry

    if provider.split("/", 1)[0] not in registry.compute_names():
        raise InvalidInput.field(field, f"unknown provider {provider!r}; use one of "
                                 f"{', '.join(registry.compute_names())}")
    if get_store().connections.get(org, compute_connection_slot(provider)) is None:
        raise InvalidInput.field(field, f"no {provider} compute connection is saved; an owner saves it first "
                                 f"(`tensorant connections save-compute {provider} ...`, or PUT /api/{route_of(provider)})")


def _labelled(label: str, what: str, check: Callable[[], None]) -> None:
    """Run one check; its 422 names the candidate (`candidates[i]`) instead of the single-offer field."""
    try:
        check()
    except InvalidInput as exc:
        raise InvalidInput(f"{label} ({what}): {exc.detail}", errors=[
            {**e, "field": label, "message": f"{what}: {e.get('message', exc.detail)}"}
            for e in (exc.errors or [{"message": exc.detail}])]) from exc


def unreachable_storage(org: str, offer: GpuOffer) -> str | None:
    """Why the org's storage cannot be used from a machine of this offer, or None. A provider that mounts the
    org's network volume (its working files live on it: RunPod) can mount it only in its datacenter; any
    other machine reaches the volume over its S3-compatible API."""
    from shared.providers.registry import info_of

    config = storage_config(org)
    info = info_of(offer.provider)
    if isinstance(config, RunPodVolumeConfig) and info is not None and info.working_files_on_storage \
            and offer.region != config.datacenter_id:
        return (f"the organization's storage is RunPod network volume {config.volume_id} in datacenter "
                f"{config.datacenter_id}, and a pod mounts it only there; this offer is in {offer.region or 'any'} "
                "(refresh the RunPod catalog, or choose a GPU of that datacenter)")
    return None


def _check_one(org: str, body: RunCreate, req: CandidateRequest, label: str, model: DeclaredModel,
               training: TrainingSettings, strict_price: bool) -> RunCandidate:
    provider = provider_of(req.connection)
    what = f"{req.connection} {req.offer_id}"
    _labelled(label, what, lambda: check_provider(org, req.connection))
    _labelled(label, what, lambda: base_models.refuse_test_model(model, provider))
    offer: GpuOffer | None = None

    def found() -> None:
        nonlocal offer
        offer = find_offer(org, req.connection, req.offer_id)

    _labelled(label, what, found)
    assert offer is not None
    got = offer
    _labelled(label, what, lambda: check_fit(org, req.connection, got, model, training))
    _labelled(label, what, lambda: base_models.refuse_unloadable(model, provider))
    if strict_price and got.total_per_hour > body.price_limit_per_hour:
        raise InvalidInput.field(label, f"{what} costs {got.total_per_hour:g} {got.currency}/h, above the run's "
                                 f"price_limit_per_hour of {body.price_limit_per_hour:g}: raise the limit or "
                                 "leave this candidate out")
    why = unreachable_storage(org, got)
    if why:
        raise InvalidInput.field(label, f"{what}: {why}")
    return RunCandidate(connection=req.connection, offer=got)


def _requests(body: RunCreate) -> list[tuple[CandidateRequest, str]]:
    """The candidates asked for, each with the field its refusal names: the run's provider/offer_id
    first (unless `candidates` starts with it), then `candidates[i]`."""
    listed = [(c, f"candidates[{i}]") for i, c in enumerate(body.candidates or [])]
    own = body.connection or body.provider
    if listed and listed[0][0].connection == own and listed[0][0].offer_id == body.offer_id:
        return listed
    return [(CandidateRequest(connection=own, offer_id=body.offer_id), ""), *listed]


def resolve(org: str, body: RunCreate, model: DeclaredModel, training: TrainingSettings,
            dataset: DatasetVersionRecord) -> list[RunCandidate]:
    """Every candidate of the request, checked, in order (the first is the run's provider/offer)."""
    asked = _requests(body)
    if len(asked) > MAX_CANDIDATES:
        raise InvalidInput.field("candidates", f"{len(asked)} candidates with the run's own offer; at most "
                                 f"{MAX_CANDIDATES}: leave some out")
    seen: set[tuple[str, str]] = set()
    out: list[RunCandidate] = []
    several = len(asked) > 1 or body.fallback == "fitting"
    for req, label in asked:
        key = (req.connection, req.offer_id)
        if key in seen:
            raise InvalidInput.field(label or "candidates", f"{req.connection} {req.offer_id} is listed twice")
        seen.add(key)
        if not label:  # the run's own provider/offer: refused as a single offer always was
            own = req.connection
            if body.connection:
                check_connection_name(body.connection, provider=body.provider)
            check_provider(org, own, field="connection" if body.connection else "provider")
            base_models.refuse_test_model(model, body.provider)
            offer = find_offer(org, own, body.offer_id)
            check_fit(org, own, offer, model, training)
            base_models.refuse_unloadable(model, body.provider)
            if several and offer.total_per_hour > body.price_limit_per_hour:
                raise InvalidInput.field("offer_id", (
                    f"{offer.offer_id} costs {offer.total_per_hour:g} {offer.currency}/h, above the run's "
                    f"price_limit_per_hour of {body.price_limit_per_hour:g}; with candidates every one must be "
                    "under it"))
            why = unreachable_storage(org, offer)
            if why:
                raise InvalidInput.field("offer_id", why)
            out.append(RunCandidate(connection=own, offer=offer))
        else:
            out.append(_check_one(org, body, req, label, model, training, strict_price=True))
    if body.fallback == "fitting":
        out += fitting(org, body, model, training, dataset, exclude=seen)[:MAX_CANDIDATES - len(out)]
    return out


def fitting(org: str, body: RunCreate, model: DeclaredModel, training: TrainingSettings,
            dataset: DatasetVersionRecord, exclude: set[tuple[str, str]]) -> list[RunCandidate]:
    """Every offer of the org's connected compute connections that passes a candidate's checks, cheapest
    forecast cost first, then cheapest price (the order `fallback: "fitting"` adds them in)."""
    from shared.providers import registry

    scored: list[tuple[float, float, str, RunCandidate]] = []
    for rec in get_store().connections.in_org(org):
        if not rec.slot.startswith("compute:") or rec.status != ConnectionStatus.connected:
            continue
        name = rec.slot.removeprefix("compute:")
        provider = provider_of(name)
        if not registry.available(provider):
            continue
        if base_models.is_test_model(model) and not declaration(provider).builds_test_models \
                and not _test_models_allowed():
            continue
        if not base_models.loadable(model, provider):
            continue
        for offer in cached_offers(org, name):
            if (name, offer.offer_id) in exclude or offer.total_per_hour > body.price_limit_per_hour:
                continue
            if not base_models.fit(model, offer, training).fits or unreachable_storage(org, offer):
                continue
            cost = forecast.predict(dataset, training, model, offer, forecast.measured_for(
                org, offer.provider, body.base_model, offer.gpu, training)).cost
            scored.append((cost, offer.total_per_hour, f"{name} {offer.offer_id}",
                           RunCandidate(connection=name, offer=offer)))
    scored.sort(key=lambda s: s[:3])
    return [s[3] for s in scored]


def _test_models_allowed() -> bool:
    from shared.settings import get_settings

    return get_settings().allow_test_models
