"""The layout rules that no type checker sees: which package may import which, and the one place a
run's state change is recorded (docs/architecture.md, "Layers").

Three deployables, three top-level packages: shared/ (the control plane: the Functions app deploys it),
machine/ (the machine's payload: the agent and the trainer, which the training image copies) and
adapter_format/ (the declared base models and the adapter archive format, which both use)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
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


def _type_only(tree: ast.AST) -> set[ast.AST]:
    """The import statements under `if TYPE_CHECKING:`: read by the type checker, never run."""
    return {n for test in ast.walk(tree) if isinstance(test, ast.If) and ast.unparse(test.test) in
            ("TYPE_CHECKING", "typing.TYPE_CHECKING") for stmt in test.body for n in ast.walk(stmt)}


def imports(path: Path, *, run_only: bool = False) -> set[str]:
    """Every module `path` imports, at the top or inside a function (`from a import b` counts as a.b too);
    with run_only, not those under `if TYPE_CHECKING:` (they are never run, so they make no import cycle)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    skip = _type_only(tree) if run_only else set()
    for node in ast.walk(tree):
        if node in skip:
            continue
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
    assert writes == {"create": {"self._table.insert"}, "put": {"self._table.update"}, "_checked_put": {"self.put"}}
    # decide's write is _checked_put, which checks the transition table first; nothing else calls it.
    callers = {m.name for m in runs.body if isinstance(m, ast.FunctionDef)
               for n in ast.walk(m) if isinstance(n, ast.Call) and ast.unparse(n.func) == "self._checked_put"}
    assert callers == {"decide"}
    [checked] = [m for m in runs.body if isinstance(m, ast.FunctionDef) and m.name == "_checked_put"]
    assert "check_write" in ast.unparse(checked.body[1])


def test_each_store_repository_is_small() -> None:
    """The store is one small repository per table or aggregate (shared/store/), never again one class with
    a method for every table: at most 12 public methods each."""
    sizes = {f"{p.relative_to(ROOT)}:{node.name}": sum(1 for f in node.body if isinstance(f, ast.FunctionDef)
                                                       and not f.name.startswith("_"))
             for p in sources("store") for node in ast.parse(p.read_text()).body if isinstance(node, ast.ClassDef)}
    assert "shared/store/runs.py:Runs" in sizes and "shared/store/repo.py:Store" in sizes
    assert {name: n for name, n in sizes.items() if n > 12} == {}


# A provider value: a name or attribute ending in `provider` (`provider`, `run.provider`, `offer.provider`,
# `provider_name`), a connection's name (`connection`, `body.connection`), `provider_of(...)`, or such a key read
# from a dict (`body["provider"]`, `row.get("connection")`). `kind` names too many things here (resources, events,
# functions): it counts only when it is compared with a provider's or a storage connection's kind name.
PROVIDER_VALUE = re.compile(r"(^|_)provider(_name)?$|^(connection|connection_name)$")
KIND = re.compile(r"(^|_)kind$")
CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")  # LOCAL_PROVIDER, base_models.LOCAL_PROVIDER, RUNPOD
# Where a provider's name is its own business: the registry, and each provider's own package.
DECLARATIONS = ("shared/providers/registry.py", *(f"shared/providers/{p.name}/" for p in (SHARED / "providers").iterdir()
                                                   if (p / "__init__.py").is_file()))


def _ident(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args \
            and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    return None


def _is_provider_value(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and _ident(node.func) == "provider_of":
        return True
    name = _ident(node)
    return name is not None and bool(PROVIDER_VALUE.search(name))


def _is_names(node: ast.AST) -> bool:
    """A provider's name as code writes it: a string literal, a module constant, or a set/tuple/list of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value != ""  # == "": whether one is set, not which
    if isinstance(node, (ast.Name, ast.Attribute)):
        return bool(CONSTANT.match(_ident(node) or ""))
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        return any(_is_names(e) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
        return any(_is_names(a) for a in node.args)
    return False


def _is_kind_name(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    return isinstance(node, (ast.Set, ast.Tuple, ast.List)) and any(_is_kind_name(e, names) for e in node.elts)


def _pattern_names(p: ast.pattern, is_name: Callable[[ast.AST], bool]) -> bool:
    if isinstance(p, ast.MatchValue):
        return is_name(p.value)
    if isinstance(p, ast.MatchOr):
        return any(_pattern_names(x, is_name) for x in p.patterns)
    return isinstance(p, ast.MatchAs) and p.pattern is not None and _pattern_names(p.pattern, is_name)


def provider_branches(source: str, kind_names: set[str]) -> list[int]:
    """The lines where `source` decides by a provider's name: a provider value compared (==, !=, in, not in, is,
    match/case) with a string literal, a module constant or a set/tuple/list of names; a `kind` compared with one
    of `kind_names`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, sides[:-1], sides[1:], strict=True):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)):
                    continue
                member = isinstance(op, (ast.In, ast.NotIn))  # `"aws" in providers` asks another question
                if (_is_provider_value(a) and _is_names(b)) or (not member and _is_provider_value(b) and _is_names(a)) \
                        or (_ident(a) and KIND.search(_ident(a) or "") and _is_kind_name(b, kind_names)) \
                        or (not member and _ident(b) and KIND.search(_ident(b) or "") and _is_kind_name(a, kind_names)):
                    found.append(node.lineno)
        elif isinstance(node, ast.Match):
            if _is_provider_value(node.subject):
                is_name: Callable[[ast.AST], bool] = _is_names
            elif KIND.search(_ident(node.subject) or ""):
                is_name = lambda n: _is_kind_name(n, kind_names)  # noqa: E731
            else:
                continue
            if any(_pattern_names(case.pattern, is_name) for case in node.cases):
                found.append(node.lineno)
    return sorted(found)


def provider_names_written(source: str, names: set[str]) -> list[int]:
    """The lines where `source` writes a provider's name as a string (`provider = "local"`, `compute_for(org,
    "runpod")`, `LOCAL_PROVIDER = "local"`): a service that picks a provider by name."""
    return sorted(n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and n.value in names)


def _kind_names() -> set[str]:
    from shared.org_storage.registry import storage_kinds
    from shared.providers.registry import providers
    from shared.settings import Settings

    return set(providers()) | set(storage_kinds(Settings()))


def _code_files() -> list[Path]:
    tops = [ROOT / "shared", ROOT / "functions", ROOT / "tools", ROOT / "adapter_format", ROOT / "machine"]
    return [ROOT / "function_app.py", *sorted(p for top in tops for p in top.rglob("*.py")
                                              if "node_modules" not in p.parts and ".venv" not in p.parts)]


def test_nothing_branches_on_a_providers_name() -> None:
    """What a provider can do is declared in its ProviderInfo (shared/providers/registry.py: trains_on_cpu,
    builds_test_models, lists_network_volumes, resumes_training, ..., each with its refusal), never decided by its
    name outside the registry and its own package: the control plane, the handlers, the tools, the machine."""
    kinds = _kind_names()
    offenders = [f"{rel}:{n}" for p in _code_files() if not (rel := str(p.relative_to(ROOT))).startswith(DECLARATIONS)
                 for n in provider_branches(p.read_text(), kinds)]
    assert offenders == [], f"declare the ability in ProviderInfo and read it instead: {offenders}"


def test_no_service_writes_a_providers_name() -> None:
    from shared.providers.registry import providers

    names = set(providers())
    files = [*sources("services", "runs", "store"), *sorted((ROOT / "functions").rglob("*.py")), ROOT / "function_app.py"]
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in files for n in provider_names_written(p.read_text(), names)]
    assert offenders == [], f"pick the provider by a declared ability, not by its name: {offenders}"


BAD = """
LOCAL_PROVIDER = "local"
CLOUDS = frozenset({"aws", "azure"})
if offer.provider == LOCAL_PROVIDER: pass
if run.provider != "runpod": pass
if provider in ("aws", "azure"): pass
if provider_of(name) not in CLOUDS: pass
if "local" == body["provider"]: pass
if base_models.LOCAL_PROVIDER == provider_name: pass
if req.connection == "aws": pass
if config.kind == "runpod_volume": pass
match run.provider:
    case "aws" | "azure": pass
match connection.kind:
    case "s3": pass
"""
GOOD = """
if run.provider == other.provider: pass
if run.connection == "": pass
if info.trains_on_cpu is not None: pass
if resource.kind == "instance": pass
if provider in providers(): pass
if "aws" in compute_names(): pass
match event.kind:
    case "transition": pass
"""


def test_the_provider_branch_check_finds_each_kind_of_branch() -> None:
    kinds = {"aws", "azure", "runpod", "local", "s3", "runpod_volume"}
    assert provider_branches(BAD, kinds) == [4, 5, 6, 7, 8, 9, 10, 11, 12, 14]
    assert provider_branches(GOOD, kinds) == []
    assert provider_names_written(BAD, {"aws", "azure", "runpod", "local"}) == [2, 3, 3, 5, 6, 6, 8, 10, 13, 13]
    assert {"aws", "azure", "runpod", "local", "s3", "runpod_volume"} <= _kind_names()


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
    """The three packages' modules -> the modules of theirs each imports (anywhere in it, lazy imports included;
    not those for typing only: a module that shared.context imports, such as the store's, names Context so)."""
    mods: dict[str, Path] = {}
    for p in (path for package in PACKAGES for path in (ROOT / package).rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return {m: {x for x in imports(p, run_only=True) if x in mods and x != m} for m, p in mods.items()}


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


# What the API's run services take from admission (shared/runs/admission.py): a run request is admitted by one
# call, `admit`; the other names serve other answers (the model list, the catalog's fit note, the launch's fresh
# price and limits), never a second path through a request's checks.
ADMISSION_USERS = {
    "shared/services/api/runs/drafts.py": {"admit", "Admitted", "TRIAL_MAX_EXAMPLES", "TRIAL_MAX_STEPS",
                                          "TRIAL_RUNTIME_LIMIT_S"},
    "shared/services/api/runs/actions.py": {"find_offer"},
    "shared/services/api/quotas.py": {"check_limits"},
    "shared/services/api/base_models.py": {"fits_cpu", "loadable", "offered", "providers_on_cpu"},
    "shared/services/api/catalog.py": {"declared", "listed_fit"},
}


def _admission_names(path: Path) -> set[str]:
    """The names `path` takes from shared.runs.admission: imported by name, or read as `admission.<name>`."""
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "shared.runs.admission" for alias in node.names}
    return names | {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name) and node.value.id == "admission"}


def test_a_run_request_is_admitted_by_one_call() -> None:
    """Creating a run once wandered through the API's checks.py, base_models.py, candidates.py and catalog.py
    (issue 44): every check a request passes before it is saved is now admission's, which the API calls once."""
    used = {str(p.relative_to(ROOT)): names for p in [*sources("services"), *sorted((ROOT / "functions").rglob("*.py"))]
            if (names := _admission_names(p))}
    assert used == ADMISSION_USERS
    drafts = ast.parse((SHARED / "services/api/runs/drafts.py").read_text())
    calls = {f.name: sum(1 for n in ast.walk(f) if isinstance(n, ast.Call) and ast.unparse(n.func) == "admission.admit")
             for f in drafts.body if isinstance(f, ast.FunctionDef) and f.name in ("create", "estimate", "patch")}
    assert calls == {"create": 1, "estimate": 1, "patch": 1}


def test_an_import_for_typing_only_is_no_edge_of_the_cycle_checks(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\n\nimport shared.clock\n\nif TYPE_CHECKING:\n"
                     "    from shared.context import Context\n\n\ndef f():\n    from shared.store import get_store\n")
    assert imports(probe) == {"typing", "typing.TYPE_CHECKING", "shared.clock", "shared.context",
                              "shared.context.Context", "shared.store", "shared.store.get_store"}
    assert imports(probe, run_only=True) == {"typing", "typing.TYPE_CHECKING", "shared.clock", "shared.store",
                                             "shared.store.get_store"}
