"""The GPU check's own code path, run by the test suite in its tiny mode on the CPU: the tiny model in
grouped, packed and auto, verified, with the figures a device run prints and the `auto` verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.trainer.conftest import REPO, need_torch


def test_check_training_tiny_mode_passes(tmp_path: Path) -> None:
    need_torch()
    proc = subprocess.run([sys.executable, "-m", "tests.gpu.check_training", "--tiny", "--work", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    cases = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [c["mode"] for c in cases] == ["grouped", "packed", "auto"]
    for c in cases:
        assert c["verified"] and c["loss_falls"] and c["real_tokens_per_s"] > 0, c
        assert {"padding_fraction", "peak_gpu_gib", "table_peak_gib", "table_needed_gib"} <= set(c)
    assert cases[1]["padding_fraction"] == 0.0 < cases[0]["padding_fraction"]
    assert cases[2]["batching"] == "packed"  # the CPU's measured rule
    verdict = next(line for line in proc.stdout.splitlines() if "auto should pick" in line)
    assert "tensorant/tiny-llama: grouped" in verdict and "it picked packed" in verdict
    assert "check_training: PASS (3/3 cases)" in proc.stdout
