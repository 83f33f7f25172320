"""The checks a run request passes before it is saved as a draft (create and edit alike), and the
settings it resolves to (trial bounds, the runtime limit from the forecast)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapter_format.base_models import MAX_MERGED_BYTES, DeclaredModel
from shared.errors import InvalidInput
from shared.models import DatasetVersionRecord, Forecast, GpuOffer, RunCreate, RunKind, TrainingSettings
from shared.runs import forecast
from shared.runs.org_backends import compute_connection_slot
from shared.services.api import base_models, quotas
from shared.services.api.catalog import cached_offers, find_offer
from shared.settings import get_settings
from shared.store import get_store

# Trial runs: a small sample, a few steps, a short default time limit, so a user sees
# the whole flow and a first adapter in minutes. A user's smaller values win.
TRIAL_MAX_EXAMPLES = 64


TRIAL_MAX_STEPS = 30


TRIAL_RUNTIME_LIMIT_S = 20 * 60


def resolve_training(kind: RunKind, training: TrainingSettings) -> TrainingSettings:
    """The settings the trainer gets: `kind` from the run, trial bounds applied."""
    if training.kind is not None and training.kind != kind.value:
        raise InvalidInput.field("training.kind", f"is {training.kind!r} but the run's kind is {kind.value!r}; "
                                 "leave it out (it is set from the run's kind)")
    update: dict[str, Any] = {"kind": kind.value}
    if kind == RunKind.trial:
        update["max_examples"] = min(training.max_examples or TRIAL_MAX_EXAMPLES, TRIAL_MAX_EXAMPLES)
        update["max_steps"] = min(training.max_steps or TRIAL_MAX_STEPS, TRIAL_MAX_STEPS)
    return training.model_copy(update=update)


def _check_fit(org: str, provider: str, offer: GpuOffer, model: DeclaredModel, training: TrainingSettings) -> None:
    """422 on offer_id when the offer cannot hold the model at these settings, with the offers that can."""
    got = base_models.fit(model, offer, training)
    if got.fits:
        return
    eligible = [o.offer_id for o in cached_offers(org, provider) if base_models.fit(model, o, training).fits]
    if eligible:
        choose = f"offers that fit: {', '.join(eligible[:20])}"
    elif offer.provider == base_models.LOCAL_PROVIDER and model.param_count() > base_models.LOCAL_MAX_PARAMS:
        # No setting brings a model over the CPU cap under it: only another model or provider helps.
        choose = (f"{model.name} is too large for the local CPU provider: choose a smaller model (up to "
                  f"{base_models.LOCAL_MAX_PARAMS / 1e9:g}B parameters, GET /api/base-models) or a GPU provider")
    else:
        choose = f"no {provider} offer fits; lower batch_size or max_seq_len, or set load_in_4bit"
    raise InvalidInput(f"offer_id: {got.why}; {choose}", errors=[{
        "field": "offer_id", "message": got.why, "memory_needed_gb": got.memory_needed_gb,
        "eligible_offer_ids": eligible}])


def _check_merged(model: DeclaredModel, training: TrainingSettings) -> None:
    """training.merged only where the merged weights fit one merged archive (adapter_format.base_models)."""
    from adapter_format.merged import MERGE_ARCHITECTURES

    if training.merged and model.architecture not in MERGE_ARCHITECTURES:
        raise InvalidInput.field("training.merged", (
            f"a merged model is verified for {', '.join(MERGE_ARCHITECTURES)} architectures; {model.name} is "
            f"{model.architecture}: leave merged out, download the adapter and merge it where you serve it "
            "(peft's merge_and_unload)"))
    if training.merged and model.merged_bytes() > MAX_MERGED_BYTES:
        raise InvalidInput.field("training.merged", (
            f"{model.name}'s merged weights take {model.merged_bytes() / 1e9:.1f} GB in bf16, more than the "
            f"{MAX_MERGED_BYTES / 1024**3:g} GiB a merged model may take (one upload and one verification); leave "
            "merged out, download the adapter and merge it where you serve it (peft's merge_and_unload)"))


def _check_provider(org: str, provider: str) -> None:
    from shared.providers import registry

    if provider not in registry.compute_names():
        raise InvalidInput.field("provider", f"unknown provider {provider!r}; use one of "
                                 f"{', '.join(registry.compute_names())}")
    if get_store().connections.get(org, compute_connection_slot(provider)) is None:
        raise InvalidInput.field("provider", f"no {provider} compute connection is saved; an owner saves it first "
                                 f"(`tensorant connections save-compute {provider} ...`)")


@dataclass(frozen=True)
class CheckedRequest:
    """A run request that passed every check a draft must pass, resolved as the run stores it."""

    offer: GpuOffer
    training: TrainingSettings
    runtime_limit_s: int
    dataset: DatasetVersionRecord
    forecast: Forecast
    # Said in the run's events when the default runtime limit came from the forecast; else "".
    limit_note: str = ""
    # A base model named by Hub id: the commit id its shapes were read at (shared/runs/hub_models.py); else "".
    base_model_revision: str = ""


def check_request(org: str, body: RunCreate) -> CheckedRequest:
    """Every check a draft passes, the one path for create and a draft's edit (an edit
    that skipped them once saved an undeclared model, which the machine then fetched from the hub with
    the org's token). The org's limits and the rate limit are the caller's (quotas)."""
    store = get_store()
    # 422 before any lookup: the cheapest refusal first (a Hub model's record is read from the hub once)
    model, revision = base_models.for_request(org, body.base_model, body.base_model_revision)
    training = resolve_training(body.kind, body.training)
    _check_merged(model, training)
    store.projects.get(org, body.project_id)
    dataset = store.datasets.get(org, body.dataset_version_id)
    if dataset.project_id != body.project_id:
        raise InvalidInput.field("dataset_version_id", "this dataset version belongs to another project")
    _check_provider(org, body.provider)
    base_models.refuse_test_model_off_local(model, body.provider)
    offer = find_offer(org, body.provider, body.offer_id)
    _check_fit(org, body.provider, offer, model, training)
    base_models.refuse_unloadable_on_local(model, body.provider)
    like = forecast.measured_for(org, body.provider, body.base_model, offer.gpu, training)  # the index: one read
    predicted = forecast.predict(dataset, training, model, offer, like)
    limit, note = _runtime_limit(org, body, predicted)
    return CheckedRequest(offer=offer, training=training, runtime_limit_s=limit, dataset=dataset,
                          forecast=predicted, limit_note=note, base_model_revision=revision)


def _runtime_limit(org: str, body: RunCreate, predicted: Forecast) -> tuple[int, str]:
    """The user's runtime limit; else the default (a trial's 20 min, a full run's setting), unless the
    forecast with its margin needs more: then that, capped by the org's max_runtime_limit_s (a limit
    the org refuses would make the draft unlaunchable). Returns the limit and what to say about it."""
    if body.runtime_limit_s:
        return body.runtime_limit_s, ""
    default = TRIAL_RUNTIME_LIMIT_S if body.kind == RunKind.trial else get_settings().default_runtime_limit_s
    wanted = forecast.runtime_limit_for(predicted)
    if wanted <= default:
        return default, ""
    cap = quotas.get_limits(org).max_runtime_limit_s
    limit = min(wanted, cap)
    capped = f", capped at the organization's max_runtime_limit_s of {cap // 60} min" if limit < wanted else ""
    return limit, (f"runtime limit set to {limit // 60} min from the forecast ({forecast.RUNTIME_MARGIN:g} x "
                   f"~{forecast.minutes(predicted.total_s)}, rounded up to {forecast.RUNTIME_STEP_S // 60} min"
                   f"{capped}): the default of {default // 60} min is shorter than the forecast needs")
