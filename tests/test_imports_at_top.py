"""The app's own modules are imported at the top of a module, where a reader sees what it depends on (issue 44,
item 7): an import inside a function is allowed only for a stated reason, listed here. Lazy SDK imports
(azure.*, boto3, runpod, torch, ...) are not the app's modules and stay lazy (shared/providers/lazy.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ("shared", "functions", "machine", "adapter_format", "function_app")

_NUMPY = "adapter_format.verify loads numpy (about 0.1 s more on every cold start)"
# (file, module) -> why that function-level import is not at the top.
ALLOWED = {
    ("shared/providers/local/__init__.py", "shared.providers.local.models"):
        "it imports the trainer (machine/): only when the local provider is asked about a model",
    ("shared/providers/azure/client.py", "shared.providers.azure.sdk"): "the Azure SDK: lazy SDK imports",
    ("shared/runs/admission.py", "adapter_format.merged.MERGE_ARCHITECTURES"): _NUMPY,
    ("shared/services/steps/verify_adapter.py", "adapter_format.merged.MAX_MERGED_BYTES"): _NUMPY,
    ("shared/services/steps/verify_adapter.py", "adapter_format.merged.verify_merged"): _NUMPY,
    ("shared/services/steps/verify_adapter.py", "adapter_format.verify.verify_adapter"): _NUMPY,
}
# Every provider package's registration entry (its __init__.py: no SDK import, shared/providers/README.md) builds
# the provider from its lifecycle module: the providers there are now and any one added later.
LIFECYCLE = re.compile(r"shared/providers/(?P<name>[a-z0-9_]+)/__init__\.py shared\.providers\.(?P=name)\.compute")


def _allowed(hit: tuple[str, str]) -> bool:
    return hit in ALLOWED or LIFECYCLE.fullmatch(" ".join(hit)) is not None


def late_imports(path: Path, root: Path = ROOT) -> set[tuple[str, str]]:
    """(file, module) for each import of an app module inside a function of `path`; `from a import b` is a.b,
    a relative import counts as the app's."""
    found: set[tuple[str, str]] = set()
    rel = path.relative_to(root).as_posix()
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                names = [f"{base}.{alias.name}" if base.strip(".") else base + alias.name for alias in node.names]
            else:
                continue
            found |= {(rel, name) for name in names if name.startswith(".") or name.split(".")[0] in APP}
    return found


def _app_sources() -> list[Path]:
    return [ROOT / "function_app.py", *sorted(p for package in APP[:-1] for p in (ROOT / package).rglob("*.py"))]


def test_the_apps_own_modules_are_imported_at_the_top() -> None:
    found = {hit for path in _app_sources() for hit in late_imports(path)}
    assert sorted(hit for hit in found if not _allowed(hit)) == [], \
        "import it at the top, or add it to ALLOWED with the reason"
    assert sorted(set(ALLOWED) - found) == [], "ALLOWED names an import that is gone: remove it"
    assert {hit for hit in found if LIFECYCLE.fullmatch(" ".join(hit))} >= {
        (f"shared/providers/{name}/__init__.py", f"shared.providers.{name}.compute") for name in ("aws", "local")}


def test_the_check_finds_a_late_import_of_the_app(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import json\nfrom shared.clock import now\n\n"
                     "def f():\n    import boto3\n    from shared.store import get_store\n    import machine.agent\n\n"
                     "    def g():\n        from . import sibling\n        from .models import Run\n\n"
                     "class C:\n    async def h(self):\n        import adapter_format.verify as v\n")
    assert late_imports(probe, tmp_path) == {
        ("probe.py", "shared.store.get_store"), ("probe.py", "machine.agent"), ("probe.py", ".sibling"),
        ("probe.py", ".models.Run"), ("probe.py", "adapter_format.verify")}


def test_only_a_providers_own_lifecycle_module_is_allowed_late() -> None:
    assert _allowed(("shared/providers/gcp/__init__.py", "shared.providers.gcp.compute"))
    assert not _allowed(("shared/providers/gcp/__init__.py", "shared.providers.aws.compute"))
    assert not _allowed(("shared/providers/gcp/__init__.py", "shared.providers.gcp.client"))
    assert not _allowed(("shared/runs/moves.py", "shared.providers.gcp.compute"))
