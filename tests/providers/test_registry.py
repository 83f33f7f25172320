"""The provider registry: one table, typed factories, one override point."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from shared.errors import InvalidInput
from shared.providers import registry
from shared.providers.base import ComputeProvider
from shared.settings import Settings
from tests.fakes import Cloud, MemoryCompute, MemoryConfig

ROOT = Path(__file__).resolve().parents[2]

BROKEN_PROVIDER = '''
from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from shared.models import Check, CloudResource, GpuOffer, MachineState
from shared.providers.base import ComputeProvider, Description, LaunchSpec, Outcome, RunRef
from shared.settings import Settings
from shared.providers.local.compute import LocalCompute


class Renamed(LocalCompute):
    pass


class Broken:
    """A provider whose list_managed was renamed: everything else is there."""

    name = "broken"

    def validate(self) -> list[Check]:
        return []

    def offers(self) -> list[GpuOffer]:
        return []

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        return []

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        return Description(state=MachineState.gone)

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        return Outcome(done=True)

    def start(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        return Outcome(done=True)

    def release(self, ref: RunRef, resources: list[CloudResource]) -> Outcome:
        return Outcome(done=True)

    def list_managed_renamed(self) -> Iterable[CloudResource]:
        return []


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    return Broken()
'''


def test_every_entry_loads_and_its_factory_is_typed() -> None:
    for info in registry.PROVIDERS.values():
        model = registry.config_model(info.name)
        assert issubclass(model, BaseModel)
        factory = registry.factory(info.name)
        assert callable(factory)
        if inspect.isfunction(factory):  # azure's is still the class (see registry.PROVIDERS)
            assert inspect.signature(factory).return_annotation in ("ComputeProvider", ComputeProvider), info.name
        assert all(m and not m.startswith(".") for m in info.sdk_modules)
    assert registry.sdk_modules() == sorted(set(registry.sdk_modules()))
    assert {"boto3", "runpod"} <= set(registry.sdk_modules())


def test_unknown_provider_is_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        registry.config_model("gcp")


def test_override_serves_a_name_until_undone() -> None:
    cloud = Cloud()
    assert "memory2" not in registry.compute_names()
    with registry.override("memory2", factory=lambda c, s: MemoryCompute(c, s, cloud), config_model=MemoryConfig):
        assert "memory2" in registry.compute_names()
        assert registry.config_model("memory2") is MemoryConfig
        made = registry.make_compute("memory2", MemoryConfig(), Settings(deployment_id="test"))
        assert isinstance(made, MemoryCompute)
        undo = registry.override("memory2", factory=lambda c, s: MemoryCompute(c, s, Cloud()),
                                 config_model=MemoryConfig)
        undo()  # restores the outer override, not nothing
        assert registry.config_model("memory2") is MemoryConfig
    assert "memory2" not in registry.compute_names()
    # A known name keeps its config model unless one is given.
    with registry.override("local", factory=lambda c, s: MemoryCompute(c, s, cloud)):
        assert registry.config_model("local").__name__ == "LocalConfig"
        assert isinstance(registry.make_compute("local", MemoryConfig(), Settings()), MemoryCompute)
    assert registry.factory("local").__name__ == "build"


def test_wrong_config_type_is_refused_by_the_factory() -> None:
    with pytest.raises(TypeError):
        registry.make_compute("runpod", MemoryConfig(), Settings())


def test_mypy_rejects_a_provider_missing_a_protocol_method(tmp_path: Path) -> None:
    """The registry's factories return ComputeProvider, so mypy checks the class at that return."""
    snippet = tmp_path / "broken_provider.py"
    snippet.write_text(BROKEN_PROVIDER)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent",
         str(snippet)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'Incompatible return value type (got "Broken", expected "ComputeProvider")' in out.stdout
    assert "list_managed" in out.stdout
    assert out.stdout.count("error:") == 1, out.stdout  # the complete provider (Renamed) passes


def test_openapi_provider_parameter_lists_the_registry(env: dict[str, str]) -> None:
    import function_app
    from shared.openapi import build

    doc = build(function_app.app)
    enums = [p["schema"]["enum"] for path in doc["paths"].values() for op in path.values()
             for p in op.get("parameters", []) if p["name"] == "provider"]
    assert enums and all(e == registry.compute_names() for e in enums)
    assert {"aws", "azure", "local", "runpod"} <= set(enums[0])
