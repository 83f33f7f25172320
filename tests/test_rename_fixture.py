"""tools/rename_fixture.py: a fixture renamed in its definition and at every use in the tests and fixtures that
request it, nothing else; a module it cannot rename whole is named and left as it was."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from tools.rename_fixture import main

CONFTEST = '''
import pytest

@pytest.fixture
def h(env):
    """The harness."""
    harness = make()
    yield harness
'''

TESTS = '''
import pytest

from tests.fakes import Cloud


def helper(h: Harness, n: int) -> int:
    return h.count + n


def test_uses(h: Harness, cloud: Cloud) -> None:
    """Drives `harness`."""
    run = h.create_run("memory")  # through `harness`
    seen = [h.org for _ in range(2)]
    shadowed = [h for h in ("a", "b")]
    inner = lambda h: h + 1
    def later() -> str:
        return h.org
    assert f"{h.org}/{run}" and later() and helper(h, 1) and cloud.h and inner(1) and seen and shadowed


def test_with_a_class(h: Harness) -> None:
    class Fake:
        def go(self) -> str:
            return h.org
    assert Fake().go()


class TestGroup:
    def test_method(self, h: Harness) -> None:
        h.ok("GET", "/x")


@pytest.fixture
def calls(h: Harness) -> int:
    return h.calls
'''


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_the_fixture_and_its_uses_are_renamed_and_nothing_else(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path, {"conftest.py": CONFTEST, "test_a.py": TESTS})
    assert main(["h", "harness", str(root), "--check"]) == 1  # would change: nothing written
    assert (root / "test_a.py").read_text() == TESTS
    assert main(["h", "harness", str(root)]) == 0
    assert "changed 2 files, 4 functions: h -> harness" in capsys.readouterr().out
    conftest = (root / "conftest.py").read_text()
    assert "def harness(env):" in conftest and "    harness = make()\n    yield harness\n" in conftest
    got = (root / "test_a.py").read_text()
    ast.parse(got)
    assert "def helper(h: Harness, n: int) -> int:\n    return h.count + n" in got  # a helper: not asked for
    assert 'def test_uses(harness: Harness, cloud: Cloud) -> None:\n    """Drives `harness`."""' in got
    assert 'run = harness.create_run("memory")  # through `harness`' in got
    assert "seen = [harness.org for _ in range(2)]" in got
    assert 'shadowed = [h for h in ("a", "b")]' in got and "inner = lambda h: h + 1" in got  # their own h
    assert "return harness.org" in got  # the closure's h is the parameter
    assert 'f"{harness.org}/{run}"' in got and "helper(harness, 1)" in got and "cloud.h" in got
    assert "def go(self) -> str:\n            return harness.org" in got  # a method sees the function's names
    assert 'def test_method(self, harness: Harness) -> None:\n        harness.ok("GET", "/x")' in got
    assert "def calls(harness: Harness) -> int:\n    return harness.calls" in got
    assert main(["h", "harness", str(root), "--check"]) == 0  # nothing left to rename


def test_helpers_are_renamed_by_their_annotation(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"test_a.py": TESTS})
    assert main(["h", "harness", str(root), "--helpers", "Harness"]) == 0
    assert "def helper(harness: Harness, n: int) -> int:\n    return harness.count + n" in (root / "test_a.py").read_text()


@pytest.mark.parametrize(("source", "said"), [
    ("def test_x(h):\n    harness = 1\n    return h, harness\n", "test_x already uses the name 'harness'"),
    ("import pytest\n@pytest.fixture\ndef harness():\n    return 1\ndef test_x(h):\n    return h\n",
     "test_x requests 'h' in a module with its own fixture 'harness'"),
    ("def test_x(h):\n    return run(h=h)\n", "keyword argument h="),
    ("def test_x(request):\n    return request.getfixturevalue('h')\n", "getfixturevalue('h')"),
])
def test_what_cannot_be_renamed_whole_is_named_and_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              source: str, said: str) -> None:
    root = _tree(tmp_path, {"test_a.py": source})
    assert main(["h", "harness", str(root)]) == 1
    assert said in capsys.readouterr().err
    assert (root / "test_a.py").read_text() == source
