"""Which provider serves which name: one table, loaded lazily, typed against ComputeProvider.

Each entry says where the provider's config model (what a user saves: `<provider>/config.py`,
no SDK) and its factory (`<provider>/compute.py:build`) live, and which SDK top-level
modules the provider imports. The implementation module is imported only when a step
needs the provider. Everything else that lists providers derives from PROVIDERS: the
API's and the docs' provider choices (compute_names), the packaging test and the
import bench (sdk_modules).

Typing: every factory is `build(config: BaseModel, settings: Settings) -> ComputeProvider`;
mypy checks the class it returns against the Protocol at that return, and the
TYPE_CHECKING block below checks each table entry's factory has that type, so a provider
with a missing or renamed Protocol method fails mypy.

Tests swap a provider through the one configuration point, `override(...)`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, SecretStr

from shared.errors import InvalidInput
from shared.providers.base import ComputeProvider
from shared.providers.errors import PermanentError
from shared.settings import Settings

ComputeFactory = Callable[[BaseModel, Settings], ComputeProvider]


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    config_model: str  # "module:attr" of the pydantic model a user saves
    factory: str  # "module:attr" of a ComputeFactory
    sdk_modules: tuple[str, ...]  # SDK top-level modules it imports (lazily); never loaded by function_app
    # Exists only outside production (TENSORANT_ENV=production): the local provider runs its
    # "machine" as a process on the control plane's own host, which no tenant may have there.
    dev_only: bool = False


PROVIDERS: dict[str, ProviderInfo] = {p.name: p for p in (
    ProviderInfo("local", "shared.providers.local.config:LocalConfig", "shared.providers.local.compute:build", (),
                 dev_only=True),
    ProviderInfo("aws", "shared.providers.aws.config:AwsConfig", "shared.providers.aws.compute:build",
                 ("boto3", "botocore")),
    ProviderInfo("azure", "shared.providers.azure.config:AzureConfig", "shared.providers.azure.compute:build",
                 ("azure.identity", "azure.mgmt.compute", "azure.mgmt.network")),
    ProviderInfo("runpod", "shared.providers.runpod.config:RunPodConfig", "shared.providers.runpod.compute:build",
                 ("runpod",)),
)}

if TYPE_CHECKING:  # mypy only: each factory must be a ComputeFactory; nothing is imported at run time
    from shared.providers.aws.compute import build as _aws
    from shared.providers.azure.compute import build as _azure
    from shared.providers.local.compute import build as _local
    from shared.providers.runpod.compute import build as _runpod

    _TYPED: dict[str, ComputeFactory] = {"aws": _aws, "azure": _azure, "local": _local, "runpod": _runpod}

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
        if name not in PROVIDERS:
            raise ValueError(f"override of unknown provider {name!r} needs a config_model")
        config_model = _load(PROVIDERS[name].config_model)
    undo = Undo(name, _overrides.get(name))
    _overrides[name] = (factory, config_model)
    return undo


def _load(path: str) -> Any:
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


def _settings(settings: Settings | None) -> Settings:
    if settings is not None:
        return settings
    from shared.settings import get_settings

    return get_settings()


def available(provider: str, settings: Settings | None = None) -> bool:
    """Whether `provider` exists in this deployment: a dev-only one is absent in production."""
    info = PROVIDERS.get(provider)
    return not (info is not None and info.dev_only and _settings(settings).is_production)


def compute_names(settings: Settings | None = None) -> list[str]:
    """The provider names this deployment offers (default: the app's settings); in production
    without the dev-only ones, so the API, the OpenAPI and the docs never offer them there."""
    return sorted(n for n in set(PROVIDERS) | set(_overrides) if available(n, settings))


def refuse_unavailable(provider: str, settings: Settings | None = None) -> None:
    """422 naming the provider when it does not exist, or not in this deployment."""
    if provider not in PROVIDERS and provider not in _overrides:
        raise InvalidInput.field("provider", f"unknown provider {provider!r}; use one of "
                                 f"{', '.join(compute_names(settings))}")
    if not available(provider, settings):
        raise InvalidInput.field("provider", f"the {provider} provider exists only outside production (it runs on "
                                 f"the control plane's own host); use one of {', '.join(compute_names(settings))}")


def sdk_modules() -> list[str]:
    """Every provider SDK's top-level module, for the packaging test and the import bench."""
    return sorted({m for p in PROVIDERS.values() for m in p.sdk_modules})


def config_model(provider: str) -> type[BaseModel]:
    if provider in _overrides:
        return _overrides[provider][1]
    if provider not in PROVIDERS:
        raise InvalidInput.field("provider", f"unknown provider {provider!r}; use one of {', '.join(compute_names())}")
    model: type[BaseModel] = _load(PROVIDERS[provider].config_model)
    return model


def factory(provider: str) -> ComputeFactory:
    if provider in _overrides:
        return _overrides[provider][0]
    built: ComputeFactory = _load(PROVIDERS[provider].factory)
    return built


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
