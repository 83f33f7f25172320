"""The provider generator (tools/new_provider.py): what it writes registers itself, passes ruff and mypy, and
fails the provider contract until it is implemented, so a skeleton cannot pass for a provider."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tools import new_provider

ROOT = Path(__file__).resolve().parents[2]
NAME = "skel"


def scratch_copy(dest: Path) -> Path:
    """The working tree's files (tracked, and untracked ones git does not ignore), without .venv or node_modules."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = scratch_copy(tmp_path_factory.mktemp("repo"))
    out = subprocess.run([sys.executable, "-m", "tools.new_provider", NAME, "--root", str(root)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    return root, out.stdout


def test_it_writes_the_file_set_and_says_what_remains(generated: tuple[Path, str]) -> None:
    root, said = generated
    written = sorted(str(p.relative_to(root)) for p in root.glob(f"*/providers/{NAME}/*.py"))
    assert written == sorted(new_provider.files(NAME)), written
    assert f"wrote {len(written)} files" in said
    assert f"{len(new_provider.edits(NAME))} edits remain" in said and "make lock" in said
    assert f"{len(new_provider.by_hand(NAME))} files to write by hand" in said
    found = subprocess.run([sys.executable, "-c", "from shared.providers import registry; import json; "
                            "print(json.dumps(registry.compute_names()))"],
                           cwd=root, capture_output=True, text=True, timeout=120, check=True)
    assert NAME in json.loads(found.stdout)  # registered by its folder alone


def test_the_generated_files_pass_ruff_and_mypy(generated: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = generated
    paths = [f"shared/providers/{NAME}", f"tests/providers/{NAME}"]
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", *paths], cwd=root, capture_output=True, text=True,
                          timeout=120, check=False)
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr
    mypy = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                           "--follow-imports=silent", *paths], cwd=root, capture_output=True, text=True,
                          timeout=600, check=False)
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr


def test_the_contract_refuses_the_skeleton(generated: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = generated
    report = tmp_path / "contract.xml"
    subprocess.run([sys.executable, "-m", "pytest", f"tests/providers/{NAME}/test_contract.py", "-p",
                    "no:cacheprovider", f"--junitxml={report}"], cwd=root, capture_output=True, text=True,
                   timeout=600, check=False)
    cases = list(ET.parse(report).getroot().iter("testcase"))
    outcome = {c.get("name", ""): next((child.tag for child in c if child.tag in ("failure", "error", "skipped")),
                                       "passed") for c in cases}
    assert len(cases) >= 15, outcome
    assert "passed" not in outcome.values(), [n for n, o in outcome.items() if o == "passed"]
    # Only the one test whose hook a provider may lack is skipped; everything else fails.
    assert [n for n, o in outcome.items() if o == "skipped"] == ["test_release_is_done_only_after_the_cloud_confirms"]
    assert outcome["test_the_error_table_maps_every_kind"] == "failure"


@pytest.mark.parametrize("name", ["aws", "local", "Gcp", "g", "class", "gcp-2", "x" * 21])
def test_it_refuses_a_taken_or_bad_name(name: str, tmp_path: Path) -> None:
    (tmp_path / "shared" / "providers" / "aws").mkdir(parents=True)
    (tmp_path / "tests" / "providers" / "local").mkdir(parents=True)
    with pytest.raises(SystemExit):
        new_provider.write(name, tmp_path)
    assert not list(tmp_path.rglob("*.py"))
