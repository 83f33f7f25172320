"""One source of truth for the trainer's pins: machine/trainer/requirements.txt. Every third-party
import in machine/trainer/ is pinned there exactly, and the Dockerfile installs the hashed lock made
from it (machine/trainer/image-requirements.txt; tests/test_supply_chain.py checks that the lock holds
these pins). (No torch needed: the imports are read with ast.)"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "machine" / "trainer" / "requirements.txt"
# import name -> distribution name, where they differ
DIST = {"yaml": "pyyaml", "huggingface_hub": "huggingface-hub"}
# Imported only on request and installed only in the image (its lock pins it).
IMAGE_ONLY = {"bitsandbytes"}
# Imported only when the org saved a W&B key (machine/trainer/tracking.py), and not in the image yet: such a run
# logs one warning that the package is missing and trains on (tests/trainer/test_tracking.py runs it offline).
NOT_IN_IMAGE = {"wandb"}


def pins() -> dict[str, str]:
    out = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[0-9][0-9A-Za-z.]*", version), f"{line!r} is not an exact == pin"
            out[name.strip().lower()] = version
    return out


def trainer_imports() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "machine" / "trainer").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("machine", "adapter_format", "__future__")}


def test_every_trainer_import_is_pinned() -> None:
    pinned = pins()
    assert pinned["torch"] == "2.13.0"  # any other version downloads a 3 GB CUDA build in CI
    missing = sorted(n for n in trainer_imports() - IMAGE_ONLY - NOT_IN_IMAGE if DIST.get(n, n).replace("_", "-") not in pinned)
    assert not missing, f"imported by machine/trainer but not pinned in {REQUIREMENTS.name}: {missing}"


def test_dockerfile_installs_the_pins_and_runs_the_agent() -> None:
    text = (REPO / "Dockerfile").read_text()
    instructions = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    # The base is a build arg (tools/image/build.sh passes a local stand-in); its default is the real one.
    assert instructions[:2] == ["ARG BASE_IMAGE=python:3.11-slim", "FROM ${BASE_IMAGE}"]
    # The lock is a build arg (tools/image/build.sh passes the CPU one); its default is the published one.
    assert "ARG TRAINER_LOCK=machine/trainer/image-requirements.txt" in instructions
    assert "COPY ${TRAINER_LOCK} /opt/tensorant/image-requirements.txt" in instructions
    assert "RUN pip install --no-deps --require-hashes -r /opt/tensorant/image-requirements.txt" in instructions
    # The pins live in the locks: no version pin of any package in the Dockerfile.
    for name in [*pins(), "bitsandbytes"]:
        assert not re.search(rf"\b{re.escape(name)}==", text), f"{name} is pinned in the Dockerfile too"
    copies = [line.split()[1] for line in instructions if line.startswith("COPY ")]
    assert sorted(copies) == sorted(["${TRAINER_LOCK}", "machine/__init__.py", "machine/agent/",
                                     "machine/trainer/", "adapter_format/"])
    assert re.search(r"useradd .*\btrainer\b", text)
    assert 'TENSORANT_TRAINER_COMMAND="python -m machine.trainer.run"' in text
    assert instructions[-1] == 'ENTRYPOINT ["python", "-m", "machine.agent"]'
    ignore = (REPO / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1:][:4] == ["!machine/__init__.py", "!machine/agent/", "!machine/trainer/",
                                                  "!adapter_format/"]
