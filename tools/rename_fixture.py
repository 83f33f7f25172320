"""Rename a pytest fixture: its definition, every test and fixture that requests it, and each use of the
parameter inside them (nested functions and comprehensions included, unless they bind the name again).

    python -m tools.rename_fixture h harness                 rename in tests/, writing the files
    python -m tools.rename_fixture h harness --check         say what would change, write nothing (exit 1 if any)
    python -m tools.rename_fixture h harness --helpers Harness,Any
        also the helpers' parameters of that name annotated with one of these types (`def sweep(h: Harness)`)

A function is renamed only whole: one whose body already uses the new name, a module that defines its
own fixture of the new name and requests the old one, a keyword argument `old=` (its callee may or may
not be renamed) or a `getfixturevalue`/`usefixtures` string: each is named and nothing of it is written,
so the run exits 1 and says what to do by hand. Docstrings and comments that name the fixture in
backticks (`old`) are changed with it. Positions come from the ast and are checked against the text before
each edit, so a file is either rewritten exactly at the uses or left alone with an error.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
COMPS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass
class Edit:
    line: int  # 1-based
    col: int  # ast's byte offset within the line
    end: int
    def_name: bool = False  # the name after `def ` on this line (a FunctionDef's position is its `def`'s)


@dataclass
class Result:
    edits: list[Edit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    functions: int = 0


def _is_fixture(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
                isinstance(target, ast.Name) and target.id == "fixture"):
            return True
    return False


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs, *([a.kwarg] if a.kwarg else [])]


def _binds(scope: ast.AST, name: str) -> bool:
    """Whether `name` is a local of this function/lambda/comprehension scope (a parameter, an assignment,
    an import, a def/class, a for/with/except/match target, or a global/nonlocal declaration)."""
    if isinstance(scope, (*FUNCS, ast.Lambda)) and any(p.arg == name for p in _params(scope)):
        return True
    if isinstance(scope, COMPS):
        return any(name in {n.id for n in ast.walk(g.target) if isinstance(n, ast.Name)} for g in scope.generators)
    body = scope.body if isinstance(scope.body, list) else [scope.body]  # type: ignore[attr-defined]
    for node in _own_nodes(body):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, (ast.Store, ast.Del)):
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return True
        if isinstance(node, (*FUNCS, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name
                                                                   for a in node.names):
            return True
        if isinstance(node, ast.ExceptHandler) and node.name == name:
            return True
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name == name:
            return True
    return False


def _own_nodes(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node of this scope, not descending into nested scopes (their defaults and decorators are ours)."""
    todo = list(body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (*FUNCS, ast.Lambda)):
            todo.extend(_outer_parts(node))
        elif isinstance(node, COMPS):
            todo.append(node.generators[0].iter)
        elif isinstance(node, ast.ClassDef):
            todo.extend([*node.decorator_list, *node.bases, *node.keywords])
        else:
            todo.extend(ast.iter_child_nodes(node))


def _outer_parts(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.AST]:
    """What a nested function evaluates in the enclosing scope: defaults, decorators, annotations."""
    out: list[ast.AST] = [*fn.args.defaults, *[d for d in fn.args.kw_defaults if d is not None]]
    if isinstance(fn, FUNCS):
        out += [*fn.decorator_list, *([fn.returns] if fn.returns else [])]
        out += [p.annotation for p in _params(fn) if p.annotation is not None]
    return out


def _uses(node: ast.AST, name: str, out: list[ast.Name]) -> None:
    """The Name nodes under `node` that refer to the enclosing scope's `name`."""
    if isinstance(node, ast.Name):
        if node.id == name:
            out.append(node)
        return
    if isinstance(node, (*FUNCS, ast.Lambda)):
        for part in _outer_parts(node):
            _uses(part, name, out)
        if not _binds(node, name):
            for child in (node.body if isinstance(node.body, list) else [node.body]):
                _uses(child, name, out)
        return
    if isinstance(node, COMPS):
        _uses(node.generators[0].iter, name, out)
        if not _binds(node, name):
            rest: list[ast.AST] = [node.generators[0].target, *node.generators[0].ifs]
            for g in node.generators[1:]:
                rest += [g.target, g.iter, *g.ifs]
            rest += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for part in rest:
                _uses(part, name, out)
        return
    if isinstance(node, ast.ClassDef):  # its methods see the function's names; its own body may not
        for outer in [*node.decorator_list, *node.bases, *node.keywords]:
            _uses(outer, name, out)
        if _binds(node, name):
            raise ValueError(f"line {node.lineno}: class {node.name} binds {name!r} itself: rename it by hand")
        for stmt in node.body:
            _uses(stmt, name, out)
        return
    for sub in ast.iter_child_nodes(node):
        _uses(sub, name, out)


def _mentions(fn: ast.AST, name: str) -> int | None:
    """The line of a use of `name` anywhere in `fn` (a local, a global, a parameter), or None."""
    for node in ast.walk(fn):
        if (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.arg) and node.arg == name):
            return node.lineno
    return None


def _requests(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function pytest calls with fixtures: a test (a module's or a class's) or a fixture."""
    return fn.name.startswith("test") or _is_fixture(fn)


def _functions(tree: ast.Module) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
    """Every function with whether it is a method (tests in classes request fixtures as methods)."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_class = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, FUNCS):
                yield child, in_class
                stack.append((child, False))
            elif isinstance(child, ast.ClassDef):
                stack.append((child, True))
            else:
                stack.append((child, in_class))


def _annotation_name(arg: ast.arg) -> str | None:
    ann = arg.annotation
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        return ann.value
    if isinstance(ann, ast.Name):
        return ann.id
    if isinstance(ann, ast.Attribute):
        return ann.attr
    return None


def plan(source: str, old: str, new: str, helper_types: frozenset[str] = frozenset()) -> Result:
    """The edits that rename fixture `old` to `new` in one module's source, or the problems that stop it."""
    tree = ast.parse(source)
    res = Result()
    defines_new = any(isinstance(f, FUNCS) and f.name == new and _is_fixture(f) for f in ast.walk(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == old:
            res.problems.append(f"line {node.value.lineno}: keyword argument {old}=: rename it by hand with its callee")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("getfixturevalue", "usefixtures")
                and any(isinstance(a, ast.Constant) and a.value == old for a in node.args)):
            res.problems.append(f"line {node.lineno}: {node.func.attr}({old!r}): rename it by hand")
    for fn, in_class in _functions(tree):
        if fn.name == old and _is_fixture(fn):
            if _binds(tree, new) and not in_class:
                res.problems.append(f"line {fn.lineno}: the module already has a {new!r}")
                continue
            res.edits.append(Edit(fn.lineno, 0, 0, def_name=True))
        param = next((p for p in _params(fn) if p.arg == old), None)
        if param is None:
            continue
        fixture_param = _requests(fn)
        if not fixture_param and _annotation_name(param) not in helper_types:
            continue
        if fixture_param and defines_new:
            res.problems.append(f"line {fn.lineno}: {fn.name} requests {old!r} in a module with its own fixture {new!r}")
            continue
        if (found := _mentions(fn, new)) is not None:
            res.problems.append(f"line {found}: {fn.name} already uses the name {new!r}")
            continue
        names: list[ast.Name] = []
        try:
            for stmt in fn.body:
                _uses(stmt, old, names)
        except ValueError as e:
            res.problems.append(f"{fn.name}: {e}")
            continue
        res.functions += 1
        res.edits.append(Edit(param.lineno, param.col_offset, param.col_offset + len(old.encode())))
        res.edits += [Edit(n.lineno, n.col_offset, n.end_col_offset or 0) for n in names]
    return res


def apply(source: str, edits: list[Edit], old: str, new: str) -> str:
    """The source with each edit made, checked: the text at each position must be `old`."""
    lines = source.splitlines(keepends=True)
    raw = [line.encode() for line in lines]
    by_line: dict[int, list[tuple[int, int]]] = {}
    for e in edits:
        if e.def_name:
            m = re.match(rb"(\s*(?:async\s+)?def\s+)" + re.escape(old.encode()) + rb"\b", raw[e.line - 1])
            if m is None:
                raise ValueError(f"line {e.line}: no `def {old}` found")
            e = Edit(e.line, m.end(1), m.end(1) + len(old.encode()))
        by_line.setdefault(e.line - 1, []).append((e.col, e.end))
    for i, spans in by_line.items():
        text = raw[i]
        for col, end in sorted(set(spans), reverse=True):
            if text[col:end] != old.encode():
                raise ValueError(f"line {i + 1}: expected {old!r} at column {col}, found {text[col:end]!r}")
            text = text[:col] + new.encode() + text[end:]
        raw[i] = text
    return b"".join(raw).decode()


def rename_mentions(source: str, old: str, new: str) -> str:
    """`old` in backticks (docstrings, comments) becomes `new`."""
    return source.replace(f"`{old}`", f"`{new}`")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("paths", nargs="*", default=["tests"], help="files or folders (default: tests)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything would change")
    ap.add_argument("--helpers", default="", help="comma-separated annotation names: helpers' parameters to rename too")
    args = ap.parse_args(argv)
    if not (args.old.isidentifier() and args.new.isidentifier()):
        ap.error("both names must be identifiers")
    helper_types = frozenset(t for t in args.helpers.split(",") if t)
    files = sorted({f for p in map(Path, args.paths) for f in ([p] if p.is_file() else p.rglob("*.py"))})
    changed, functions, problems = [], 0, []
    for path in files:
        source = path.read_text()
        try:
            res = plan(source, args.old, args.new, helper_types)
            text = apply(source, res.edits, args.old, args.new) if not res.problems else source
        except (SyntaxError, ValueError) as e:
            problems.append(f"{path}: {e}")
            continue
        problems += [f"{path}: {p}" for p in res.problems]
        if res.problems:
            continue
        text = rename_mentions(text, args.old, args.new)
        if text != source:
            changed.append(path)
            functions += res.functions
            if not args.check:
                path.write_text(text)
    verb = "would change" if args.check else "changed"
    print(f"{verb} {len(changed)} files, {functions} functions: {args.old} -> {args.new}")
    for p in problems:
        print(f"  not renamed: {p}", file=sys.stderr)
    return 1 if problems or (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
