"""The provider registry: each provider package declares its entry, factories are typed, one override
point, and every registered provider has a contract test class that runs."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pydantic import BaseModel

from shared.errors import InvalidInput
from shared.providers import registry
from shared.providers.base import ComputeProvider
from shared.settings import Settings
from tests.fakes import Cloud, MemoryCompute, MemoryConfig
from tests.providers.contract import CloudContract

ROOT = Path(__file__).resolve().parents[2]

BROKEN_PROVIDER = '''
from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from shared.models import Check, CloudResource, GpuOffer, MachineState
from shared.providers.base import ComputeProvider, Description, LaunchSpec, CloudProgress, RunRef
from shared.settings import Settings
from shared.providers.local.compute import LocalCompute
from shared.providers.local.config import LocalConfig
from shared.providers.registry import ProviderInfo


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

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        return CloudProgress(done=True)

    def start(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        return CloudProgress(done=True)

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        return CloudProgress(done=True)

    def list_managed_renamed(self) -> Iterable[CloudResource]:
        return []

    def scope(self) -> dict[str, str]:
        return {}


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    return Broken()


def build_without_settings(config: BaseModel) -> ComputeProvider:
    return Renamed(LocalConfig(), Settings())


PROVIDER = ProviderInfo("broken", LocalConfig, build_without_settings, {})
'''


def test_every_entry_loads_and_its_factory_is_typed() -> None:
    assert {"aws", "azure", "local", "runpod"} <= set(registry.providers())
    for name, info in registry.providers().items():
        assert info.name == name
        assert issubclass(registry.config_model(name), BaseModel)
        factory = registry.factory(name)
        assert inspect.isfunction(factory), name
        assert inspect.signature(factory).return_annotation in ("ComputeProvider", ComputeProvider), name
        assert all(m and not m.startswith(".") for m in info.sdk_modules)
    assert registry.sdk_modules() == sorted(set(registry.sdk_modules()))
    assert {"boto3", "runpod.api.mutations.pods"} <= set(registry.sdk_modules())
    assert registry.smoke_trainer_providers() == ["local"]


def test_finding_the_providers_imports_no_lifecycle_module_and_no_sdk() -> None:
    # The registry imports each package's __init__ (and its config): compute.py and the SDK client
    # only when a step builds the provider.
    code = ("import sys; from shared.providers import registry; names = list(registry.providers()); "
            "tops = {s.split('.')[0] for s in registry.sdk_modules()}; "
            "print(sorted(m for m in sys.modules if m.endswith(('.compute', '.client')) or m.split('.')[0] in tops))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


NEW_PROVIDER = """
from shared.providers.local import build
from shared.providers.local.config import LocalConfig
from shared.providers.registry import ProviderInfo

PROVIDER = ProviderInfo("nocloud", LocalConfig, build, {}, sdk_modules=("nocloud_sdk",))
"""


def test_a_new_folder_is_the_only_registration(tmp_path: Path) -> None:
    # A provider package on the search path of shared.providers is found with nothing else edited;
    # a package there without its PROVIDER is an error naming the file to fix.
    (tmp_path / "nocloud").mkdir()
    init = tmp_path / "nocloud" / "__init__.py"
    code = ("import sys, shared.providers as p; p.__path__.append(sys.argv[1]); "
            "from shared.providers import registry; print(registry.compute_names(), registry.sdk_modules())")

    def names() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, check=False)

    init.write_text(NEW_PROVIDER)
    found = names()
    assert found.returncode == 0, found.stderr
    assert "'nocloud'" in found.stdout and "'nocloud_sdk'" in found.stdout, found.stdout
    init.write_text("# a provider that forgot its PROVIDER\n")
    found = names()
    assert found.returncode == 1 and "shared/providers/nocloud/__init__.py must set PROVIDER" in found.stderr, \
        found.stderr


def test_unknown_provider_is_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        registry.config_model("no-such-cloud")


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


def test_mypy_rejects_a_provider_missing_a_protocol_method_or_a_factory_argument(tmp_path: Path) -> None:
    """A factory returns ComputeProvider, so mypy checks the class at that return; ProviderInfo.factory is
    a ComputeFactory, so mypy checks the factory's signature where the package declares PROVIDER."""
    snippet = tmp_path / "broken_provider.py"
    snippet.write_text(BROKEN_PROVIDER)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent",
         str(snippet)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'Incompatible return value type (got "Broken", expected "ComputeProvider")' in out.stdout
    assert "list_managed" in out.stdout
    assert 'Argument 3 to "ProviderInfo" has incompatible type "Callable[[BaseModel], ComputeProvider]"' \
        in out.stdout, out.stdout
    assert out.stdout.count("error:") == 2, out.stdout  # the complete provider (Renamed) passes


def test_openapi_provider_parameter_lists_the_registry(env: dict[str, str]) -> None:
    import function_app
    from shared.openapi import build

    doc = build(function_app.app)
    enums = [p["schema"]["enum"] for path in doc["paths"].values() for op in path.values()
             for p in op.get("parameters", []) if p["name"] == "provider"]
    assert enums and all(e == registry.compute_names() for e in enums)
    assert {"aws", "azure", "local", "runpod"} <= set(enums[0])


# The cheapest contract test that builds the provider against its fake cloud: when it passes, the class
# is collected and its provider_env fixture works (a class that skips everything skips this one too).
# CloudContract's own tests (loopback, error table, the wire) run with the class; none can be skipped but
# for a dev_only provider, and a class may not replace them (overridden_tests).
PROBE_TEST = "test_launch_twice_is_one_machine"


def contract_classes(module: object) -> list[type]:
    return [c for c in vars(module).values()
            if isinstance(c, type) and issubclass(c, CloudContract) and c is not CloudContract]


def overridden_tests(cls: type) -> list[str]:
    """The contract's tests a provider's class replaces (it may supply provider_env and nothing else)."""
    return sorted(n for n in dir(cls) if n.startswith("test_")
                  and any(n in vars(base) for base in cls.__mro__ if not issubclass(CloudContract, base)))


def test_every_provider_has_a_contract_class_that_runs(tmp_path: Path) -> None:
    files = []
    for name in registry.providers():
        # Without it pytest imports test_contract.py by its bare name, which clashes with the next such folder.
        assert (ROOT / "tests" / "providers" / name / "__init__.py").exists(), f"tests/providers/{name}/__init__.py"
        module = importlib.import_module(f"tests.providers.{name}.test_contract")
        classes = contract_classes(module)
        assert classes, f"tests/providers/{name}/test_contract.py: no CloudContract class"
        for cls in classes:
            assert not overridden_tests(cls), f"{cls.__name__} replaces contract tests {overridden_tests(cls)}"
        files.append(f"tests/providers/{name}/test_contract.py")
    report = tmp_path / "contract.xml"
    out = subprocess.run([sys.executable, "-m", "pytest", *files, "-k", PROBE_TEST, "-p", "no:cacheprovider",
                          f"--junitxml={report}"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    passed = {case.get("classname", "") for case in ET.parse(report).getroot().iter("testcase")
              if not any(child.tag in ("skipped", "failure", "error") for child in case)}
    missing = [name for name in registry.providers()
               if not any(c.startswith(f"tests.providers.{name}.test_contract.") for c in passed)]
    assert not missing, f"no contract test ran and passed for {missing}:\n{out.stdout[-3000:]}"


def test_a_contract_class_may_not_replace_the_contracts_tests() -> None:
    class Lenient(CloudContract):
        def test_the_error_table_maps_every_kind(self) -> None:  # type: ignore[override]
            pass

    class Plain(CloudContract):
        pass

    assert overridden_tests(Lenient) == ["test_the_error_table_maps_every_kind"]
    assert overridden_tests(Plain) == []
