"""The development environment installs under its lock: requirements-dev.txt (`make lock`, from requirements-dev.in)
pins every dependency the app, its extras, the tools and the trainer declare, each with its hashes, at a version
their ranges admit; `make install` installs under it, so a dependency's new release changes nothing a fresh
clone or CI tests until `make lock` moves its pin."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements-dev.txt"
TOOLS = ("tools/client", "tools/cli", "tools/devhost")
# This repository's own packages: installed editable from the checkout, never resolved from an index.
LOCAL = {"tensorant-control-plane", "tensorant-client", "tensorant-cli", "tensorant-devhost"}


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(text: str) -> tuple[dict[str, str], dict[str, int], list[str]]:
    """name -> version, name -> its hash count, and the editable lines of a pip-compile lock."""
    pins: dict[str, str] = {}
    hashes: dict[str, int] = {}
    editable: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip().removesuffix("\\").strip()
        if not line:
            continue
        if line.startswith("--hash=sha256:"):
            hashes[current] = hashes.get(current, 0) + 1
        elif line.startswith("-e "):
            editable.append(line[3:])
        else:
            name, sep, version = line.partition("==")
            assert sep and version and not any(c in version for c in "<>=!~*,; "), f"not pinned exactly: {raw!r}"
            current = _name(name)
            pins[current] = version
    return pins, hashes, editable


def _declared() -> list[tuple[str, Requirement]]:
    """(where, requirement) for every dependency make install asks for."""
    out: list[tuple[str, Requirement]] = []
    for where in (".", *TOOLS):
        project = tomllib.loads((ROOT / where / "pyproject.toml").read_text())["project"]
        deps = [*project.get("dependencies", [])]
        for extra in project.get("optional-dependencies", {}).values():
            deps += extra
        out += [(f"{where}/pyproject.toml", Requirement(d)) for d in deps]
    for line in (ROOT / "machine/trainer/requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(("machine/trainer/requirements.txt", Requirement(line)))
    return out


def test_every_declared_dependency_is_pinned_with_hashes_in_the_dev_lock() -> None:
    pins, hashes, _ = _pins(LOCK.read_text())
    declared = _declared()
    assert len(declared) > 30
    for where, req in declared:
        name = _name(req.name)
        if name in LOCAL:
            continue
        assert name in pins, f"{req.name} ({where}) is not in requirements-dev.txt: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements-dev.txt pins {req.name}=={pins[name]}, outside {where}'s {req.specifier}: run `make lock`")
    unhashed = sorted(n for n in pins if not hashes.get(n))
    assert not unhashed, f"pinned without a --hash line: {unhashed}: run `make lock`"
    assert not LOCAL & set(pins), "the repository's own packages are installed from the checkout, not pinned"


def test_the_dev_lock_agrees_with_the_deployment_lock_and_names_no_machine_path() -> None:
    text = LOCK.read_text()
    pins, _, editable = _pins(text)
    deployed, _, _ = _pins((ROOT / "requirements.txt").read_text())
    # The app is tested at the versions it is deployed with.
    differ = {n: (v, pins.get(n)) for n, v in deployed.items() if n in pins and pins[n] != v}
    assert not differ, f"requirements-dev.txt and requirements.txt pin these differently: {differ}: run `make lock`"
    assert sorted(editable) == [".", "./tools/cli", "./tools/client", "./tools/devhost"], editable
    assert "file://" not in text and str(ROOT) not in text, "the lock names a checkout's path: run `make lock`"


def test_make_install_installs_under_the_dev_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("$(STAMP):"):makefile.index("@touch $@")]
    assert "$(DEV_LOCK)" in recipe.splitlines()[0], "a moved pin must reinstall: the stamp depends on the lock"
    installs = [line for line in recipe.splitlines() if "$(PIP)" in line]
    assert len(installs) == 3, installs
    for line in installs:  # each pip install is held to the lock's pins, or installs one exact pin and no deps
        assert "-c $(DEV_CONSTRAINTS)" in line or ("--no-deps" in line and "==" in line), line
    pins, _, _ = _pins(LOCK.read_text())
    # The constraints make install derives from the lock (name==version alone, what pip accepts beside -e).
    derive = next(line for line in recipe.splitlines() if "> $(DEV_CONSTRAINTS)" in line)
    pattern = re.search(r"'s/(.*)/\\1/p'", derive)
    assert pattern, derive
    sed = re.compile(pattern.group(1).replace("\\(", "(").replace("\\)", ")"))
    derived = [m.group(1).partition("==") for line in LOCK.read_text().splitlines() if (m := sed.match(line))]
    assert {_name(n): v for n, _, v in derived} == pins and len(derived) == len(pins)
