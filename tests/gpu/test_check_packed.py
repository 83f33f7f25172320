"""The GPU check as the device machine runs it, in its CPU mode: a fresh virtual environment that holds
only torch and torch's own needs (as the machine holds only its image's packages), the wheels packed
by tools/gpu/pack.py for this interpreter, installed from that folder with no index, then the check in
its tiny mode with the TRL comparison, its figures written as JSON and a table to --out.

Opt-in (-m gpu_pack): packing downloads the wheels from the package index once (cached in
.tensorant/gpu-wheels-test/), and the whole test takes minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from importlib.metadata import distribution
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, need_torch

pytestmark = [pytest.mark.gpu_pack, pytest.mark.timeout(1200)]
CACHE = REPO / ".tensorant" / "gpu-wheels-test"
TORCH_NEEDS = ("torch", "filelock", "typing-extensions", "setuptools", "sympy", "mpmath", "networkx", "jinja2",
               "markupsafe", "fsspec")


def machine_site(target: Path) -> list[str]:
    """target: links to torch and its needs from this environment (the device's torch stands in);
    returns their name==version lines."""
    target.mkdir()
    have = []
    for name in TORCH_NEEDS:
        dist = distribution(name)
        have.append(f"{name}=={dist.version}")
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (target / top).exists() and top != "__pycache__":
                (target / top).symlink_to(source)
    return have


@pytest.fixture(scope="module")
def opt_in(request: pytest.FixtureRequest) -> None:
    if "gpu_pack" not in (request.config.option.markexpr or ""):
        pytest.skip("opt-in (downloads wheels once, minutes): run with -m gpu_pack")
    need_torch()


def test_check_runs_from_the_packed_folder_with_no_index(opt_in: None, tmp_path: Path) -> None:
    have = machine_site(tmp_path / "machine")
    (tmp_path / "have.txt").write_text("\n".join(have) + "\n")
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not (CACHE / "pack.json").exists():
        proc = subprocess.run([sys.executable, "-m", "tools.gpu.pack", "--dest", str(CACHE), "--python-version",
                               python_version, "--have", str(tmp_path / "have.txt"), "--budget-mib", "400"],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.skip(f"could not pack from the index here: {proc.stdout[-500:]}{proc.stderr[-500:]}")
    packed = json.loads((CACHE / "pack.json").read_text())
    assert not any(name.startswith("torch==") for name in packed["packed"])
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = next((env_dir / "lib").glob("python*/site-packages"))
    (site / "machine.pth").write_text(str(tmp_path / "machine") + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV", "TENSORANT_"))}
    env.update(PIP_INDEX_URL="http://127.0.0.1:9/nothing", PIP_NO_INDEX="1", HF_HUB_OFFLINE="1")
    # The fresh environment has torch and nothing the trainer needs beside it.
    bare = subprocess.run([str(python), "-c", "import torch; import transformers"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert bare.returncode != 0 and "No module named 'transformers'" in bare.stderr, bare.stderr
    out = tmp_path / "out"
    proc = subprocess.run([str(python), "-m", "tests.gpu.check_training", "--wheels", str(CACHE), "--tiny", "--trl",
                           "--work", str(tmp_path / "work"), "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert "(no index)" in proc.stdout and "check_training: PASS" in proc.stdout
    report = json.loads((out / "check.json").read_text())
    assert report["ok"] and report["device"] == "cpu"
    assert any(v.startswith("transformers 5.24.0, pinned 5.24.0") for v in report["versions"]), report["versions"]
    ours = [r for r in report["results"] if not r.get("trl") and not r.get("skipped")]
    # Flex attention trains on a GPU only: on the CPU its case says so.
    assert [r["mode"] for r in report["results"] if r.get("skipped")] == ["packed_flex"]
    trl = [r for r in report["results"] if r.get("trl")]
    assert [r["mode"] for r in trl] == ["grouped", "packed"]
    for r in trl:  # like for like: assistant tokens only, counted from TRL's batches, a ratio printed
        assert r["ok"] and r["trl_trained_tokens"] > 0 and r["trl_real_tokens_per_s"] > 0, r
        assert r["trl_trained_tokens"] < r["trl_real_tokens"]  # the prompts carry no loss
        assert r["project_over_trl"] > 0
    assert all(r["fits_table"] for r in ours)
    text = (out / "check.txt").read_text()
    assert "project/TRL" in text and "real tokens/s =" in text
