"""No test-only or dead code in production modules: every function, class, method and module-level name defined
in the deployables and the tools (shared/, functions/, machine/, adapter_format/, function_app.py, tools/) is
used by production code, or it moves to tests/support/ (what only tests use) or is removed (what nothing uses).

"Used" is by name, as Python finds it: an identifier, an attribute, an import, a keyword argument, a word in a
string (getattr, imports by name, function names a host looks up), or a word in the production files that are
not Python (Makefile, Dockerfile, pyproject's entry points, infra/, workflows, the console's JS). A use inside
a name that is itself unused does not count (a helper of a test-only helper is test-only too). A function or
method with a decorator other than the plain ones (a route, a trigger, a validator) is used by whoever the
decorator registers it with."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON_ROOTS = ("shared", "functions", "machine", "adapter_format", "function_app.py", "tools")
TEXT_ROOTS = (*PYTHON_ROOTS, "infra", ".github", ".ci", "Dockerfile", "Makefile", "pyproject.toml", "host.json")
TEXT_SUFFIXES = {".sh", ".js", ".mjs", ".html", ".css", ".json", ".toml", ".yml", ".yaml", ".bicep", ".in", ".cfg",
                 ".txt", ""}
SKIPPED_DIRS = {"__pycache__", "node_modules", ".venv", ".tensorant",
                "docs_assets"}  # Swagger UI's vendored bundle: its words are not uses of ours
# The VM check's harness (make vm-check): run only by tests/e2e/test_vm_e2e.py, a test tool by purpose.
SKIPPED_PACKAGES = ("tools/vm/",)
# tensorant_client is a library: its public names are for its users (README's examples), not for this repo.
LIBRARY_PACKAGES = ("tools/client/",)
# Plain decorators: they register nothing, so a function under them still needs a caller.
PLAIN_DECORATORS = {"staticmethod", "classmethod", "property", "cache", "lru_cache", "cached_property", "overload"}

# Names production defines that only tests use, kept on purpose (path:name -> why).
ALLOWED = {
    "shared/clock.py:set_clock": "the seam tests install a simulated clock through; production reads the clock "
                                 "(now, now_ts) that it sets",
    "shared/queues.py:reset_queues": "the seam that forgets the process's queues after a test changes settings; "
                                     "get_queues builds them again",
    "shared/budget.py:BOUNDS": "the bound every registered function declares (the rule); tests/test_budget.py "
                               "holds each function to it",
    "shared/budget.py:bound_s": "the bound of each BOUNDS kind, which tests/test_budget.py measures against",
    "machine/trainer/encoding.py:TokenStore.nbytes": "the store's own footprint, bounded by "
                                                     "tests/trainer/test_encoding.py (outside it would read five "
                                                     "private arrays)",
    "tools/devhost/tensorant_devhost/serving.py:Parser.parse_header": "an override: waitress's parser calls it",
}

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
Key = tuple[str, str]  # (path, qualified name)


def unused(python: dict[str, str], texts: Iterable[str], *, roots: Iterable[str] = (),
           library: tuple[str, ...] = ()) -> set[str]:
    """'path:name' of every definition in `python` (path -> source) that nothing outside unused definitions
    uses; `roots` ('path:name') count as used; in a `library` package only private names are checked."""
    defs: dict[Key, str] = {}
    uses: dict[str, list[Key | None]] = defaultdict(list)  # name -> the definitions using it (None: code outside any)

    for path, source in python.items():
        tree = ast.parse(source)
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        init = path.endswith("__init__.py")

        def define(name: str, qualified: str, path: str = path) -> Key | None:
            if name.startswith("__") or (path.startswith(library) and not name.startswith("_")):
                return None
            defs[(path, qualified)] = name
            return (path, qualified)

        def visit(node: ast.AST, owner: Key | None, cls: str | None,
                  docstrings: set[int] = docstrings, init: bool = init) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    for d in child.decorator_list:
                        visit(ast.Expr(d), owner, cls)
                    if isinstance(child, ast.ClassDef):
                        for b in [*child.bases, *(k.value for k in child.keywords)]:
                            visit(ast.Expr(b), owner, cls)
                    registered = any(_decorator(d) not in PLAIN_DECORATORS for d in child.decorator_list)
                    top = isinstance(node, ast.Module)
                    method = isinstance(node, ast.ClassDef) and not isinstance(child, ast.ClassDef)
                    key = None
                    if (top or method) and not registered:
                        key = define(child.name, f"{cls}.{child.name}" if method and cls else child.name)
                    visit(child, key or owner, child.name if isinstance(child, ast.ClassDef) else cls)
                    continue
                if isinstance(node, ast.Module) and isinstance(child, ast.Assign | ast.AnnAssign) and not init:
                    targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                    names = [t.id for t in targets if isinstance(t, ast.Name)]
                    if len(names) == 1 and (key := define(names[0], names[0])):
                        visit(child, key, cls)
                        continue
                if isinstance(child, ast.Name):
                    uses[child.id].append(owner)
                elif isinstance(child, ast.Attribute):
                    uses[child.attr].append(owner)
                elif isinstance(child, ast.alias) and not init:  # a package's re-export is not a use
                    for part in child.name.split("."):
                        uses[part].append(owner)
                elif isinstance(child, ast.keyword) and child.arg:
                    uses[child.arg].append(owner)
                elif (isinstance(child, ast.Constant) and isinstance(child.value, str)
                      and id(child) not in docstrings):
                    for word in _WORD.findall(child.value):
                        uses[word].append(owner)
                if not (init and isinstance(child, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "__all__" for t in child.targets)):
                    visit(child, owner, cls)

        visit(tree, None, None)
    for text in texts:
        for word in set(_WORD.findall(text)):
            uses[word].append(None)

    rooted = set(roots)
    dead: set[Key] = set()
    changed = True
    while changed:  # a use inside an unused definition does not count
        changed = False
        for key, name in defs.items():
            if key in dead or f"{key[0]}:{key[1]}" in rooted:
                continue
            if not any(o != key and o not in dead and not (o and o[0] == key[0] and o[1].startswith(key[1] + "."))
                       for o in uses.get(name, ())):
                dead.add(key)
                changed = True
    return {f"{path}:{name}" for path, name in dead}


def _decorator(d: ast.expr) -> str | None:
    """A decorator's name (functools.cache: cache); None for a call (a route, a trigger: it registers)."""
    return d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else None


def _files(roots: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for top in roots:
        p = ROOT / top
        for f in [p] if p.is_file() else p.rglob("*"):
            rel = f.relative_to(ROOT).as_posix()
            if f.is_file() and not SKIPPED_DIRS & set(f.relative_to(ROOT).parts) and not rel.startswith(SKIPPED_PACKAGES):
                out.append(f)
    return out


def test_production_defines_nothing_only_tests_use() -> None:
    python = {f.relative_to(ROOT).as_posix(): f.read_text() for f in _files(PYTHON_ROOTS) if f.suffix == ".py"}
    texts = [f.read_text(errors="replace") for f in _files(TEXT_ROOTS)
             if f.suffix != ".py" and (f.suffix in TEXT_SUFFIXES or f.name in ("Dockerfile", "Makefile"))]
    found = unused(python, texts, roots=ALLOWED, library=LIBRARY_PACKAGES)
    assert not found, (
        "defined in production but used only by tests, or by nothing: move what tests use to tests/support/ "
        "(or the conftest that uses it), remove the rest, or add it to ALLOWED with why:\n  " + "\n  ".join(sorted(found)))
    still_used = set(ALLOWED) - unused(python, texts, library=LIBRARY_PACKAGES)
    assert not still_used, f"production uses these now: take them off ALLOWED: {sorted(still_used)}"


def test_the_check_finds_test_only_and_dead_names() -> None:
    python = {
        "shared/a.py": (
            "import functools\n"
            "LIMIT = 3\n"
            "def used() -> int:\n    return helper() + LIMIT\n"
            "def helper() -> int:\n    return 1\n"
            "def only_tests() -> int:\n    return inner()\n"
            "def inner() -> int:\n    return 2\n"
            "def by_string() -> None: ...\n"
            "@app.route('x')\ndef handler() -> None: ...\n"
            "@functools.cache\ndef cached() -> None: ...\n"
            "class Box:\n    def kept(self) -> None: ...\n    def spare(self) -> None: ...\n"
            "def dead_with_doc() -> None:\n    '''calls kept'''\n"
        ),
        "shared/b.py": "from shared.a import used, Box\nused(); Box().kept(); getattr(object, 'by_string')\n",
        "tools/client/lib.py": "def public() -> None: ...\ndef _private() -> None: ...\n",
    }
    found = unused(python, ["Makefile: run LIMIT"], library=("tools/client/",))
    assert found == {"shared/a.py:only_tests", "shared/a.py:inner", "shared/a.py:Box.spare", "shared/a.py:cached",
                     "shared/a.py:dead_with_doc", "tools/client/lib.py:_private"}
    assert unused(python, [], roots={"shared/a.py:only_tests", "shared/a.py:Box.spare", "shared/a.py:dead_with_doc",
                                     "shared/a.py:cached"},
                  library=("tools/client/",)) == {"tools/client/lib.py:_private"}
