"""One lazy-import adaptor per SDK module a provider uses (SkyPilot's sky/adaptors/common.py LazyImport).

A provider package declares every third-party module it imports in its `sdk.py`, one adaptor each:

    compute = LazyImport("azure.mgmt.compute", "azure-mgmt-compute", needed_by="the azure provider")

Nothing is imported until the first attribute is read (`compute.ComputeManagementClient`), so
`import function_app` loads no SDK, and a missing SDK is a PermanentError that says which package to
install, not an ImportError, nor, for a namespace package such as `azure` or `google.cloud` (importable
as soon as any one of its distributions is installed), an AttributeError that names no package.

The provider's `ProviderInfo.sdk_modules` is `modules_of(sdk)`, so the list the packaging tests and the
import bench check is the list the code imports (tests/test_packaging.py also checks that no module of
a provider package imports a third-party module any other way).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from shared.errors import PermanentError


class LazyImport:
    """A module imported on first attribute access; a missing one raises PermanentError with the install hint."""

    def __init__(self, module: str, distribution: str, *, needed_by: str = "") -> None:
        self.module_name = module
        self.distribution = distribution  # what `pip install` takes, as pinned in requirements.txt
        self.needed_by = needed_by
        self._module: ModuleType | None = None

    def missing(self, module: str, why: object) -> PermanentError:
        who = f"{self.needed_by} needs" if self.needed_by else "this needs"
        return PermanentError(f"{who} the Python package {self.distribution}, which is not installed here "
                              f"({module}: {why}); install it with `pip install {self.distribution}` "
                              "(requirements.txt pins its version)", code="sdk_missing")

    def load(self) -> ModuleType:
        if self._module is None:
            try:
                module = importlib.import_module(self.module_name)
            except ImportError as exc:
                raise self.missing(self.module_name, exc) from exc
            if getattr(module, "__file__", None) is None:
                # A namespace package imports with none of the SDK's code in it: the code is in a submodule.
                raise self.missing(self.module_name, "only a namespace package is installed")
            self._module = module
        return self._module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and mypy's stubs probe dunders: never an import for them
            raise AttributeError(name)
        module = self.load()
        try:
            return getattr(module, name)
        except AttributeError:
            pass
        # A submodule the package does not import itself (boto3.s3.transfer): import it now.
        submodule = f"{self.module_name}.{name}"
        try:
            return importlib.import_module(submodule)
        except ModuleNotFoundError as exc:
            if exc.name == submodule:  # the package is installed and has no such name: a typo, not a missing SDK
                raise AttributeError(f"{self.module_name} has no attribute or submodule {name!r}") from None
            raise self.missing(submodule, exc) from exc  # one of its own dependencies is missing

    def __repr__(self) -> str:
        return f"LazyImport({self.module_name!r}, {self.distribution!r})"


def adaptors_of(module: ModuleType) -> list[LazyImport]:
    """The adaptors a provider's sdk module declares (its module-level LazyImport values)."""
    return [value for value in vars(module).values() if isinstance(value, LazyImport)]


def modules_of(module: ModuleType) -> tuple[str, ...]:
    """ProviderInfo.sdk_modules of a provider: its sdk module's adaptors' module names."""
    return tuple(sorted({a.module_name for a in adaptors_of(module)}))
