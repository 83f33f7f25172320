"""Which provider serves which name: every package under shared/providers/ declares its own entry.

A provider registers itself: its package's `__init__.py` sets `PROVIDER = ProviderInfo(...)`,
and the registry finds the packages in this folder (pkgutil) on first use. It imports only
those `__init__` modules and, through them, each `config.py`: no SDK and no lifecycle module
(`compute.py` is imported by the provider's `build` when a step needs it). Everything that
lists providers derives from providers(): the API's and the docs' provider choices
(compute_names), the packaging tests and the import bench (sdk_modules).

Typing: `ProviderInfo.factory` is a ComputeFactory, so mypy checks each provider's `build`
signature where its package declares PROVIDER, and `build` returns ComputeProvider, so mypy
checks the class it constructs against the Protocol (a missing or renamed method fails).

Tests swap a provider through the one configuration point, `override(...)`.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from pydantic import BaseModel, SecretStr

import shared.providers as package
from shared.errors import InvalidInput, PermanentError
from shared.providers.base import ComputeProvider
from shared.settings import Settings, get_settings

ComputeFactory = Callable[[BaseModel, Settings], ComputeProvider]
# (compute config, the org's storage config or None) -> the config the provider is built from
ConfigHook = Callable[[BaseModel, BaseModel | None], BaseModel]


@dataclass(frozen=True)
class CpuTraining:
    """A machine that trains on a CPU in fp32 (the local provider's: the developer's own host, no CUDA): what it
    holds and how fast, for the fit and the forecast. Each refusal is what a request refused for it is told."""

    max_params: int = 1_000_000_000  # a 1B+ model trains too slowly on a CPU to be useful
    gflops: float = 10.0  # effective fp32 throughput, the forecast's table figure
    startup_s: int = 60  # a process's imports and model load, no boot or image pull
    where: str = "on this host's CPU"
    # bitsandbytes needs CUDA.
    four_bit_refusal: str = "load_in_4bit needs a CUDA GPU; the {provider} provider trains on the CPU"
    size_refusal: str = ("the {provider} provider trains on the CPU, for models up to {max_b:g}B parameters; {model} "
                         "has {params_b:.2f}B")
    # When no offer of the provider fits: no setting brings a model over the cap under it.
    size_advice: str = ("{model} is too large for the {provider} CPU provider: choose a smaller model (up to {max_b:g}B "
                        "parameters, GET /api/base-models) or a GPU provider")


@dataclass(frozen=True)
class ProviderInfo:
    name: str  # the package's own name: shared/providers/<name>/, tests/providers/<name>/
    config_model: type[BaseModel]  # what a user saves (<name>/config.py, no SDK)
    factory: ComputeFactory  # imports the lifecycle module, and through it the SDK client, only when called
    example: dict[str, Any]  # a config_model body for the OpenAPI document (tests/test_openapi.py validates it)
    # The SDK modules the provider imports, `lazy.modules_of(sdk)`: derived from the LazyImport adaptors of its
    # sdk.py, the only way a provider package imports a third-party module (tests/test_packaging.py). Never
    # loaded by function_app, importable in the dev venv, each one's distribution in requirements.txt.
    sdk_modules: tuple[str, ...] = ()
    # Exists only outside production (TENSORANT_ENV=production): the local provider runs its
    # "machine" as a process on the control plane's own host, which no tenant may have there.
    dev_only: bool = False
    # Whether an adapter written by the smoke trainer (it trains nothing) may pass verification on
    # this provider: only on a developer's own machine. On a cloud a smoke adapter means the image
    # ran the wrong trainer.
    smoke_trainer_allowed: bool = False
    # Fills the compute config from the org's storage connection before the provider is built
    # (RunPod pins pods to the org's network volume). None: the saved config as it is.
    prepare_config: ConfigHook | None = None
    # `recover --resume` (shared/providers/base.py, "Resuming training"): start() brings the retained
    # machine back with its disk, and the training container runs its agent again on it, which continues
    # from the last checkpoint when the control plane says resume. False: the run is refused a resume.
    resumes_training: bool = False
    # The run's working files (dataset copy, checkpoints) live on the org's storage, not only on the
    # machine's disk (RunPod mounts the org's network volume): the release removes them after a
    # succeeded or cancelled run (shared/services/steps/working_files.py).
    working_files_on_storage: bool = False
    # Fields a saved connection once had and no longer takes -> what to do instead (refused by name,
    # with that advice, before the config model's generic "extra inputs" refusal).
    retired_fields: dict[str, str] = field(default_factory=dict)
    # The machine has no hub access (the local provider's trainer on this host): base model id -> how it
    # loads the model, in words ("" when it cannot), and the pip package that would make it loadable ("" when
    # none). The hook imports the machine package (machine/), which only a provider that runs the machine
    # on the control plane's own host may do. None: the machine downloads its model from the hub.
    model_source: Callable[[str], tuple[str, str]] | None = None
    unloadable_refusal: str = (
        "{model} cannot be loaded on this host: the {provider} provider's trainer has no hub access and the model is "
        "not in this host's Hugging Face cache. Choose one it can load: {ready}{packaged}; or download it once into "
        "the cache (`hf download {model}`, with hub access)")
    # What each ability below declares is never decided from the provider's name (tests/test_layers.py); a
    # provider without it refuses with the message declared next to it ({provider}: the refusing provider,
    # {able}: the providers that have it).
    #
    # The machine trains on a CPU (see CpuTraining); None: on the offer's GPU.
    trains_on_cpu: CpuTraining | None = None
    # The machine builds the test models (tensorant/*: random weights) itself. Elsewhere it asks the Hugging Face
    # hub for its base model, which has no such model: a run naming one is refused at create.
    builds_test_models: bool = False
    test_models_refusal: str = (
        "{model} is a test model (random weights built on the machine; the Hugging Face hub has no such model), "
        "accepted only on the {able} provider. For a {provider} run choose a real model: {real} (GET /api/base-models)")
    # The account's network volumes can be listed (ComputeProvider.network_volumes), for the storage picker.
    lists_network_volumes: bool = False
    network_volumes_refusal: str = "the {provider} provider cannot list network volumes"
    # The name people know the cloud by, in messages ("RunPod did not list the volumes"); "": the name.
    title: str = ""

    @property
    def shown(self) -> str:
        return self.title or self.name


def able(ability: Callable[[ProviderInfo], object]) -> list[str]:
    """The providers whose declaration has `ability` (a ProviderInfo field, read by the callable), by name: what a
    refusal names as the ones that would take the request."""
    return [name for name, info in providers().items() if ability(info)]


def declaration(name: str) -> ProviderInfo:
    """What `name` declares; a test override's name (no package of its own) has the defaults, a cloud machine's."""
    return providers().get(name) or ProviderInfo(name, BaseModel, _undeclared, {})


def _undeclared(config: BaseModel, settings: Settings) -> ComputeProvider:
    raise RuntimeError("a provider without a package is built through its override")


def resumable_providers() -> list[str]:
    """The providers that declare resumes_training, for the resume's refusal message."""
    return [name for name, info in providers().items() if info.resumes_training]


def info_of(name: str) -> ProviderInfo | None:
    """The registered entry of `name`, or None (a provider no longer installed)."""
    return providers().get(name)


def resumes_training(name: str) -> bool:
    info = providers().get(name)
    return info is not None and info.resumes_training


@functools.cache
def providers() -> dict[str, ProviderInfo]:
    """name -> entry, for every package in this folder (each one is a provider)."""
    found: dict[str, ProviderInfo] = {}
    for module in pkgutil.iter_modules(package.__path__):
        if not module.ispkg:
            continue
        info = getattr(importlib.import_module(f"{package.__name__}.{module.name}"), "PROVIDER", None)
        if not isinstance(info, ProviderInfo) or info.name != module.name:
            raise RuntimeError(f"shared/providers/{module.name}/__init__.py must set "
                               f"PROVIDER = ProviderInfo({module.name!r}, ...)")
        found[info.name] = info
    return dict(sorted(found.items()))

# Test overrides: name -> (factory, config model). Changed only through override().
_overrides: dict[str, tuple[ComputeFactory, type[BaseModel]]] = {}


class Undo:
    """What override() returns: call it, or use it as a context manager, to restore."""

    def __init__(self, name: str, previous: tuple[ComputeFactory, type[BaseModel]] | None) -> None:
        self._name = name
        self._previous = previous

    def __call__(self) -> None:
        if self._previous is None:
            _overrides.pop(self._name, None)
        else:
            _overrides[self._name] = self._previous

    def __enter__(self) -> Undo:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self()


def override(name: str, *, factory: ComputeFactory, config_model: type[BaseModel] | None = None) -> Undo:
    """Serve `name` with `factory` (and `config_model`, default: the table's) until undone.

    The one test hook of the provider wiring: the chaos test's fault-injecting provider,
    a memory provider under a new name, e2e tests that point a real provider at a fake.
    """
    if config_model is None:
        if name not in providers():
            raise ValueError(f"override of unknown provider {name!r} needs a config_model")
        config_model = providers()[name].config_model
    undo = Undo(name, _overrides.get(name))
    _overrides[name] = (factory, config_model)
    return undo


def _settings(settings: Settings | None) -> Settings:
    if settings is not None:
        return settings

    return get_settings()


def available(provider: str, settings: Settings | None = None) -> bool:
    """Whether `provider` exists in this deployment: a dev-only one is absent in production."""
    info = providers().get(provider)
    return not (info is not None and info.dev_only and _settings(settings).is_production)


def compute_names(settings: Settings | None = None) -> list[str]:
    """The provider names this deployment offers (default: the app's settings); in production
    without the dev-only ones, so the API, the OpenAPI and the docs never offer them there."""
    return sorted(n for n in set(providers()) | set(_overrides) if available(n, settings))


def refuse_unavailable(provider: str, settings: Settings | None = None) -> None:
    """422 naming the provider when it does not exist, or not in this deployment."""
    if provider not in providers() and provider not in _overrides:
        raise InvalidInput.field("provider", f"unknown provider {provider!r}; use one of "
                                 f"{', '.join(compute_names(settings))}")
    if not available(provider, settings):
        raise InvalidInput.field("provider", f"the {provider} provider exists only outside production (it runs on "
                                 f"the control plane's own host); use one of {', '.join(compute_names(settings))}")


def sdk_modules() -> list[str]:
    """Every provider SDK's top-level module, for the packaging test and the import bench."""
    return sorted({m for p in providers().values() for m in p.sdk_modules})


def example(provider: str) -> dict[str, Any] | None:
    """The provider's example connection body for the OpenAPI document; None for a test override's name."""
    info = providers().get(provider)
    return info.example if info is not None else None


def smoke_trainer_providers() -> list[str]:
    """The providers on which a smoke-trainer adapter may pass verification (a developer's own machine)."""
    return [name for name, info in providers().items() if info.smoke_trainer_allowed]


def prepare_config(provider: str, config: BaseModel, storage: Callable[[], BaseModel | None]) -> BaseModel:
    """The config `provider` is built from: its prepare_config hook applied to the org's storage
    config. `storage` is called only for a provider that has the hook (it reads the store)."""
    info = providers().get(provider)
    if info is None or info.prepare_config is None:
        return config
    return info.prepare_config(config, storage())


def config_model(provider: str) -> type[BaseModel]:
    if provider in _overrides:
        return _overrides[provider][1]
    if provider not in providers():
        raise InvalidInput.field("provider", f"unknown provider {provider!r}; use one of {', '.join(compute_names())}")
    return providers()[provider].config_model


def overridden(provider: str) -> bool:
    """Whether a test override serves `provider` (its providers are built per call, never cached)."""
    return provider in _overrides


def has_prepare_config(provider: str) -> bool:
    """Whether `provider` takes part of its config from the org's storage connection (prepare_config)."""
    info = providers().get(provider)
    return info is not None and info.prepare_config is not None


def factory(provider: str) -> ComputeFactory:
    if provider in _overrides:
        return _overrides[provider][0]
    return providers()[provider].factory


def make_compute(provider: str, config: BaseModel, settings: Settings) -> ComputeProvider:
    if not available(provider, settings):
        # A row saved before production (or copied in): never run it on the production host.
        raise PermanentError(f"the {provider} provider exists only outside production; this connection cannot be "
                             "used here")
    return factory(provider)(config, settings)


def public_config(config: BaseModel) -> dict[str, Any]:
    """The config as the API shows it: secret fields replaced by whether they are set."""
    out: dict[str, Any] = {}
    for name in type(config).model_fields:
        value = getattr(config, name)
        if isinstance(value, SecretStr):
            out[name] = {"set": bool(value.get_secret_value())}
        elif isinstance(value, BaseModel):
            out[name] = public_config(value)
        else:
            out[name] = value
    return out


def sealed_config(config: BaseModel) -> dict[str, Any]:
    """The full config with secrets revealed, for sealing at rest only."""
    out: dict[str, Any] = config.model_dump(mode="json")
    for name in type(config).model_fields:
        value = getattr(config, name)
        if isinstance(value, SecretStr):
            out[name] = value.get_secret_value()
    return out


def secret_values(config: BaseModel) -> list[str]:
    return [v.get_secret_value() for v in (getattr(config, n) for n in type(config).model_fields)
            if isinstance(v, SecretStr)]
