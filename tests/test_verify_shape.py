"""The untrusted-archive verifiers stay shaped for review (issue 32.7): in adapter_format/verify.py and
adapter_format/merged.py each function enforces one bound or does one step (docs/architecture.md, the
adapter_format row), so none is longer than MAX_LINES or has more than MAX_BRANCHES branches. Before the
split, _safe_unzip had 80 lines and 30 branches, _parse_safetensors 84 and 24, _check_pairs 71 and 30: a
reviewer could not see which bound a line belonged to. A function that grows past a limit fails here;
split it where a new bound or step begins."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ("adapter_format/verify.py", "adapter_format/merged.py")
MAX_LINES = 40  # from the def line to the last, docstring included
MAX_BRANCHES = 12
# Each is one more path through a function: a decision (if, loop, conditional expression, and/or, match
# case, a comprehension's if) or an exception path (try, each except).
_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.ExceptHandler, ast.BoolOp, ast.IfExp,
             ast.match_case)


def branches(function: ast.AST) -> int:
    count = 0
    for node in ast.walk(function):
        if isinstance(node, _BRANCHES):
            count += 1
        elif isinstance(node, ast.comprehension):
            count += len(node.ifs)
    return count


def measure(source: str) -> dict[str, tuple[int, int]]:
    """Every function and method of source (a method as Class.name): its lines and branches."""
    found: dict[str, tuple[int, int]] = {}
    for node in ast.parse(source).body:
        inside = node.body if isinstance(node, ast.ClassDef) else [node]
        for item in inside:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{node.name}.{item.name}" if isinstance(node, ast.ClassDef) else item.name
                found[name] = (item.end_lineno or item.lineno) - item.lineno + 1, branches(item)
    return found


def oversized(source: str) -> list[str]:
    return [f"{name}: {lines} lines, {count} branches" for name, (lines, count) in measure(source).items()
            if lines > MAX_LINES or count > MAX_BRANCHES]


@pytest.mark.parametrize("path", FILES)
def test_no_verifier_function_grows_past_the_limits(path: str) -> None:
    source = (ROOT / path).read_text()
    assert len(measure(source)) > 10  # the file was read and its functions found
    assert oversized(source) == [], (f"{path}: split these where a new bound or step begins (at most {MAX_LINES} "
                                     f"lines and {MAX_BRANCHES} branches a function)")


def test_the_limits_catch_a_function_that_grows() -> None:
    thirteen_ifs = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(13)) + "    return 0\n"
    long = "class C:\n    def g(self):\n" + "        x = 1\n" * 40
    hidden = "def h(xs):\n    return [x for x in xs if x if x > 1 and x < 9 or x == 0]\n"
    assert oversized(thirteen_ifs) == ["f: 28 lines, 13 branches"]
    assert oversized(long) == ["C.g: 41 lines, 0 branches"]
    assert measure(hidden) == {"h": (2, 4)}  # two comprehension ifs, an `or` and an `and`
    assert oversized("def small(x):\n    return x if x else -x\n") == []
