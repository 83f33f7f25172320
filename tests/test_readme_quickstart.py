"""The README's scripted quickstart, run as written against a started local host.

The shell block between `<!-- quickstart:begin -->` and `<!-- quickstart:end -->` is taken
from README.md and run by bash with `set -euo pipefail`, so any command that fails (a run
that does not succeed makes `runs watch` exit 1) fails the test. The host runs the smoke
trainer (TENSORANT_TRAINER_COMMAND); `tensorant` is this checkout's CLI.
"""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import ROOT, LocalHost, local_host  # noqa: F401 - the fixture, used by name

pytestmark = pytest.mark.e2e


def quickstart_block() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- quickstart:begin -->\s*```sh\n(.*?)```\s*<!-- quickstart:end -->", text, re.S)
    assert found, "README.md has no quickstart block between <!-- quickstart:begin/end --> markers"
    return found.group(1)


def test_readme_quickstart_runs_end_to_end(local_host: LocalHost, tmp_path: Path) -> None:  # noqa: F811
    script = quickstart_block()
    assert "<RUN_ID>" not in script and "<PROJECT_ID>" not in script  # nothing to copy by hand
    # `source .venv/bin/activate` puts `tensorant` on PATH; here a bin folder does the same
    # with this checkout's CLI and this interpreter (the checkout may have no .venv of its own).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    cli = bin_dir / "tensorant"
    cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tensorant_cli "$@"\n')
    cli.chmod(cli.stat().st_mode | stat.S_IEXEC)
    script = script.replace("source .venv/bin/activate", f"source {bin_dir / 'activate'}")
    env = {**local_host.env(), "TMPDIR": str(tmp_path)}
    env.pop("TENSORANT_TOKEN")  # the script mints its own (org demo)
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script],
                          cwd=work, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}"
    assert "releasing -> succeeded" in out and "succeeded after" in out
    assert "  | progress=" in out  # watch streamed the trainer's lines
    assert "final cost" in out and "loss " in out  # runs get --last
    assert list(tmp_path.glob("*.jsonl"))  # the dataset went to a temporary file (TMPDIR), not a fixed path
