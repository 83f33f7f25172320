"""Which provider module serves which name: a table of import paths, loaded lazily.

Config models (what a user saves) live in `<provider>/config.py` and import no SDK;
the implementation module is imported only when a step needs the provider.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, SecretStr

from shared.errors import InvalidInput
from shared.providers.base import ComputeProvider
from shared.settings import Settings

# name -> (config model, implementation class), as "module:attr"
COMPUTE: dict[str, tuple[str, str]] = {
    "local": ("shared.providers.local.config:LocalConfig", "shared.providers.local.compute:LocalCompute"),
    "aws": ("shared.providers.aws.config:AwsConfig", "shared.providers.aws.compute:AwsCompute"),
    "azure": ("shared.providers.azure.config:AzureConfig", "shared.providers.azure.compute:AzureCompute"),
    "runpod": ("shared.providers.runpod.config:RunPodConfig", "shared.providers.runpod.compute:RunPodCompute"),
}

# Tests register extra providers (the chaos test's fault-injecting one) here.
FACTORIES: dict[str, Callable[[BaseModel, Settings], ComputeProvider]] = {}
CONFIGS: dict[str, type[BaseModel]] = {}


def _load(path: str) -> Any:
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


def compute_names() -> list[str]:
    return sorted(set(COMPUTE) | set(FACTORIES))


def config_model(provider: str) -> type[BaseModel]:
    if provider in CONFIGS:
        return CONFIGS[provider]
    if provider not in COMPUTE:
        raise InvalidInput.field("provider", f"unknown provider {provider!r}; use one of {', '.join(compute_names())}")
    model: type[BaseModel] = _load(COMPUTE[provider][0])
    return model


def make_compute(provider: str, config: BaseModel, settings: Settings) -> ComputeProvider:
    if provider in FACTORIES:
        return FACTORIES[provider](config, settings)
    cls = _load(COMPUTE[provider][1])
    instance: ComputeProvider = cls(config, settings)
    return instance


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
