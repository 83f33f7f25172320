"""The layout rules that no type checker sees: which package may import which, and the one place a
run's state change is recorded (docs/architecture.md, "Layers").

Three deployables, three top-level packages: shared/ (the control plane: the Functions app deploys it),
machine/ (the machine's payload: the agent and the trainer, which the training image copies) and
adapter_format/ (the declared base models and the adapter archive format, which both use)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / "shared"
PACKAGES = ("shared", "machine", "adapter_format")
# The local provider runs the machine on the control plane's own host: the one place shared/ imports machine/.
RUNS_THE_MACHINE_HERE = "shared/providers/local/"
# A step that reads an API resource's helper: the dataset check before a launch and the org's
# Hugging Face token for the machine (shared/services/__init__.py names them).
STEP_READS_API = {("shared/services/steps/launch.py", "shared.services.api.projects"),
                  ("shared/services/steps/launch.py", "shared.services.api.org_secrets")}


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function (`from a import b` counts as a.b too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def sources(*folders: str) -> list[Path]:
    found = sorted(p for folder in folders for p in (SHARED / folder).rglob("*.py"))
    assert all((SHARED / folder).is_dir() for folder in folders), "a rule names a folder that moved"
    return found


def test_only_the_http_edge_imports_the_http_layer() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in sources("services", "runs", "org_storage", "providers", "store")
                 if any(m == "shared.http" or m.startswith("shared.http.") for m in imports(p))]
    assert offenders == [], f"import errors from shared.errors, not shared.http: {offenders}"


def test_steps_and_timers_import_no_api_module_but_the_named_ones() -> None:
    found = {(str(p.relative_to(ROOT)), m) for p in sources("services/steps", "services/timers")
             for m in imports(p) if m.startswith("shared.services.api.") and m.count(".") == 3}
    assert found == STEP_READS_API


def test_the_run_domain_imports_no_service() -> None:
    found = {(str(p.relative_to(ROOT)), m) for p in sources("runs") for m in imports(p)
             if m.startswith("shared.services")}
    assert found == set()


def test_only_moves_records_a_state_change() -> None:
    # A transition event written anywhere else would be a second way to change a run's state.
    users = [str(p.relative_to(ROOT)) for p in SHARED.rglob("*.py")
             if "transition_event" in p.read_text()
             and str(p.relative_to(ROOT)) not in ("shared/runs/events.py", "shared/runs/moves.py")]
    assert users == []


def test_only_the_run_repositorys_write_changes_a_run() -> None:
    """A run record is written by Runs.decide (shared/store/runs.py; mutate is decide without a decision), which
    refuses a state change the transition table does not allow and keeps the watch index and the active-run
    slot with the write; moves.py adds the transition event around it. Nothing else in the control plane
    reaches the runs table or calls Runs.put, decide's raw write (tests do, to fake an old record)."""
    import re

    runs_py = SHARED / "store" / "runs.py"
    raw = re.compile(r"""table\(\s*["']runs["']\s*\)|\bruns\.put\(""")
    offenders = [str(p.relative_to(ROOT)) for p in [*SHARED.rglob("*.py"), *(ROOT / "functions").rglob("*.py")]
                 if p != runs_py and raw.search(p.read_text())]
    assert offenders == []
    writes: dict[str, set[str]] = {}  # method of Runs -> the writes it calls (self._table.<write>, self.put)
    [runs] = [n for n in ast.parse(runs_py.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "Runs"]
    for method in (n for n in runs.body if isinstance(n, ast.FunctionDef)):
        for call in (n for n in ast.walk(method) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            target = ast.unparse(call.func)
            if target == "self.put" or re.fullmatch(r"self\._table\.(insert|update|upsert)", target):
                writes.setdefault(method.name, set()).add(target)
    assert writes == {"create": {"self._table.insert"}, "put": {"self._table.update"}, "decide": {"self.put"}}


def test_each_store_repository_is_small() -> None:
    """The store is one small repository per table or aggregate (shared/store/), never again one class with
    a method for every table: at most 12 public methods each."""
    sizes = {f"{p.relative_to(ROOT)}:{node.name}": sum(1 for f in node.body if isinstance(f, ast.FunctionDef)
                                                       and not f.name.startswith("_"))
             for p in sources("store") for node in ast.parse(p.read_text()).body if isinstance(node, ast.ClassDef)}
    assert "shared/store/runs.py:Runs" in sizes and "shared/store/repo.py:Store" in sizes
    assert {name: n for name, n in sizes.items() if n > 12} == {}


def test_no_service_branches_on_a_providers_name() -> None:
    """What a provider can do is declared in its ProviderInfo (shared/providers/registry.py: resumes_training,
    working_files_on_storage, retired_fields, ...), never decided by its name outside its own package."""
    import re

    branch = re.compile(r"""(provider|\.provider|name)\s*(==|!=)\s*["'](local|aws|azure|runpod|memory)["']""")
    files = [*sources("services", "runs", "store", "org_storage"), *sorted((ROOT / "adapter_format").rglob("*.py"))]
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in files
                 for n, line in enumerate(p.read_text().splitlines(), 1) if branch.search(line)]
    assert offenders == [], f"declare the capability in ProviderInfo instead: {offenders}"


def _package_imports(package: str) -> set[tuple[str, str]]:
    """(file, imported top-level package) for every import of one of the three packages from `package`."""
    return {(str(p.relative_to(ROOT)), m.split(".")[0]) for p in (ROOT / package).rglob("*.py")
            for m in imports(p) if m.split(".")[0] in PACKAGES and m.split(".")[0] != package}


def test_the_adapter_format_imports_neither_the_control_plane_nor_the_machine() -> None:
    assert _package_imports("adapter_format") == set()


def test_the_machine_imports_only_the_adapter_format() -> None:
    """The training image copies machine/ and adapter_format/ only (Dockerfile): a shared import fails there."""
    assert {f for f, m in _package_imports("machine") if m != "adapter_format"} == set()


def test_the_control_plane_imports_the_machine_only_where_it_runs_it() -> None:
    offenders = {f for f, m in _package_imports("shared") if m == "machine" and not f.startswith(RUNS_THE_MACHINE_HERE)}
    assert offenders == set(), "declare what a service needs from the machine as a ProviderInfo hook instead"


def test_the_functions_app_and_its_handlers_import_no_machine_module() -> None:
    handlers = [ROOT / "function_app.py", *sorted((ROOT / "functions").rglob("*.py"))]
    assert [str(p.relative_to(ROOT)) for p in handlers if any(m.split(".")[0] == "machine" for m in imports(p))] == []


def _graph() -> dict[str, set[str]]:
    """The three packages' modules -> the modules of theirs each imports (anywhere in it, lazy imports included)."""
    mods: dict[str, Path] = {}
    for p in (path for package in PACKAGES for path in (ROOT / package).rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return {m: {x for x in imports(p) if x in mods and x != m} for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycle_between_packages() -> None:
    """shared.<x>, machine.<x>, adapter_format.<x> (a package or a top-level module) -> another: no cycle, so
    each can be read, tested and moved on its own."""
    graph: dict[str, set[str]] = {}
    for m, deps in _graph().items():
        top = ".".join(m.split(".")[:2])
        graph.setdefault(top, set()).update(".".join(d.split(".")[:2]) for d in deps if not d.startswith(top))
    assert _cycles(graph) == []


def test_no_import_cycle_between_modules() -> None:
    """Module to module, lazy imports included; a package's __init__ and its own modules (a provider's
    registration entry and its lifecycle module) are one unit."""
    graph = {m: {d for d in deps if not (d.startswith(m + ".") or m.startswith(d + "."))}
             for m, deps in _graph().items()}
    assert _cycles(graph) == []
