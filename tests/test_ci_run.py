"""CI runs the checks the docs rely on: `make lint` (ruff + mypy) before `make test` (issue 32.8).

docs/architecture.md says each rule "is checked by a test or by mypy"; without the lint step mypy and
ruff would hold only by habit."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands(path: Path) -> list[str]:
    """The script's lines that run something (comments and blank lines left out)."""
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line]


def test_ci_lints_before_it_tests() -> None:
    commands = _commands(ROOT / ".ci" / "run")
    assert "make lint" in commands, ".ci/run must run `make lint`"
    assert "make test" in commands
    assert commands.index("make lint") < commands.index("make test"), "lint first: it fails in seconds, the tests take minutes"


def test_the_lint_target_runs_ruff_and_mypy_over_the_project() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target, "the Makefile has no lint target"
    recipe = target.group(1)
    # `ruff check .` (the whole tree) and a bare `mypy` (pyproject's [tool.mypy] files: every package and the tests).
    assert re.search(r"ruff check \.$", recipe, re.MULTILINE), recipe
    assert re.search(r"/mypy$", recipe, re.MULTILINE), recipe
    # On a fresh clone the tools are not there yet: the target must depend on the install.
    assert re.match(r"^lint: \$\(STAMP\)", makefile[target.start():]), "make lint must install first on a fresh clone"
