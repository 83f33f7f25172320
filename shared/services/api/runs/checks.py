"""The checks a run request passes before it is saved as a draft (create and edit alike), and the
settings it resolves to (trial bounds, the runtime limit from the forecast)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapter_format.base_models import MAX_MERGED_BYTES, DeclaredModel
from shared.errors import InvalidInput, NotFound
from shared.models import DatasetVersionRecord, Forecast, GpuOffer, RunCandidate, RunCreate, RunKind, TrainingSettings
from shared.runs import forecast
from shared.runs.org_limits import get_limits
from shared.services.api import base_models, quotas
from shared.services.api.runs import candidates as run_candidates
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


@dataclass(frozen=True)
class CheckedRequest:
    """A run request that passed every check a draft must pass, resolved as the run stores it."""

    offer: GpuOffer
    candidates: list[RunCandidate]
    training: TrainingSettings
    runtime_limit_s: int
    dataset: DatasetVersionRecord
    forecast: Forecast
    validation: DatasetVersionRecord | None = None
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
    _check_format(dataset, training, "dataset_version_id")
    validation = _check_validation(org, body)
    if validation is not None:
        _check_format(validation, training, "validation_dataset_version_id")
    most_wait = get_limits(org).max_capacity_wait_s
    if body.capacity_wait_s > most_wait:
        raise InvalidInput.field("capacity_wait_s", (
            f"{body.capacity_wait_s} s is above the organization's max_capacity_wait_s of {most_wait} s; lower it, "
            "or an owner raises max_capacity_wait_s under /api/org/limits"))
    picked = run_candidates.resolve(org, body, model, training, dataset)
    offer = picked[0].offer
    # The forecast the run shows (and the runtime limit it sets) is the one of the candidate it may cost
    # most on: the launch may end on any of them. Each is made from like runs on that candidate's GPU.
    forecasts = [forecast.predict(dataset, training, model, c.offer, forecast.measured_for(
        org, c.offer.provider, body.base_model, c.offer.gpu, training)) for c in picked]
    predicted = max(forecasts, key=lambda f: (f.cost, f.total_s))
    longest = max(forecasts, key=lambda f: f.total_s)
    limit, note = _runtime_limit(org, body, longest)
    return CheckedRequest(offer=offer, candidates=picked, training=training, runtime_limit_s=limit, dataset=dataset,
                          forecast=predicted, limit_note=note, validation=validation,
                          base_model_revision=revision)


def _check_format(dataset: DatasetVersionRecord, training: TrainingSettings, field: str) -> None:
    """method dpo trains on preference pairs and sft on examples: a version of the other kind would fail
    on the machine after its GPU was paid for."""
    if training.method == "dpo" and dataset.format != "pairs":
        raise InvalidInput.field(field, (
            "training.method is dpo but this dataset version holds training examples, not preference pairs; "
            "upload pairs ({\"prompt\", \"chosen\", \"rejected\"} or {\"messages\", \"chosen\", \"rejected\"} "
            "per line) or set training.method to sft"))
    if training.method == "sft" and dataset.format == "pairs":
        raise InvalidInput.field(field, (
            "this dataset version holds preference pairs; set training.method to dpo to train on them, or upload "
            "training examples (messages, prompt+completion or text) for sft"))


def _check_validation(org: str, body: RunCreate) -> DatasetVersionRecord | None:
    """The validation dataset version, held to the training set's checks: of the org and the run's project,
    validated at upload like every version (each row one of the dataset formats), not empty, and not the
    training version itself (evaluating on the rows it trains on would measure nothing)."""
    vid = body.validation_dataset_version_id
    if vid is None:
        return None
    if vid == body.dataset_version_id:
        raise InvalidInput.field("validation_dataset_version_id", "is the training dataset version; name another "
                                 "version, or leave it out to hold out training.eval_fraction of the training rows")
    try:
        validation = get_store().datasets.get(org, vid)
    except NotFound:
        raise InvalidInput.field("validation_dataset_version_id", f"no dataset version {vid!r} in this "
                                 "organization; upload it to the run's project first") from None
    if validation.project_id != body.project_id:
        raise InvalidInput.field("validation_dataset_version_id", "this dataset version belongs to another project")
    if validation.rows < 1:
        raise InvalidInput.field("validation_dataset_version_id", "this dataset version has no rows to evaluate on")
    return validation


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
