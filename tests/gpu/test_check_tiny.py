"""The GPU check's own code path, run by the test suite in its tiny mode on the CPU: the tiny model in
grouped, packed and auto, verified, with the figures a device run prints and the `auto` verdict; and
its merged case (training.merged), whose checks are then shown to refuse a merge that is wrong."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import REPO, need_torch

TINY = "tensorant/tiny-llama"
MODULE = "model.layers.1.self_attn.q_proj"


@dataclass(frozen=True)
class TinyRun:
    stdout: str
    cases: list[dict[str, Any]]
    work: Path

    @property
    def model_dir(self) -> Path:
        return self.work / "model-tensorant--tiny-llama"

    @property
    def merged_out(self) -> Path:
        return self.work / "out-tensorant--tiny-llama-bf16-packed-merged"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    need_torch()
    work = tmp_path_factory.mktemp("gpu-check")
    proc = subprocess.run([sys.executable, "-m", "tests.gpu.check_training", "--tiny", "--work", str(work)],
                          cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    cases = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return TinyRun(proc.stdout, cases, work)


def test_check_training_tiny_mode_passes(tiny_run: TinyRun) -> None:
    cases = tiny_run.cases
    assert [(c["mode"], c["merged"]) for c in cases] == [("grouped", False), ("packed", False),
                                                         ("packed_flex", False), ("auto", False), ("packed", True)]
    # Flex attention has no backward on the CPU: the case says so instead of training.
    assert cases[2]["skipped"].startswith("flex attention trains on a GPU only") and cases[2]["ok"]
    trained = [c for c in cases if not c.get("skipped")]
    for c in trained:
        assert c["verified"] and c["loss_falls"] and c["real_tokens_per_s"] > 0 and c["warm_tokens_per_s"] > 0, c
        assert {"padding_fraction", "peak_gpu_gib", "table_peak_gib", "table_needed_gib"} <= set(c)
    assert cases[1]["padding_fraction"] == 0.0 < cases[0]["padding_fraction"]
    assert cases[1]["attention"] == "tensorant_segments" and cases[0]["batching"] == "grouped"
    assert cases[3]["batching"] == "packed" and cases[3]["attention"] == "tensorant_segments"  # the CPU's rule
    # packed and auto (packed on the CPU): the same rows from the same weights, so the same first step.
    assert cases[3]["loss_step1"] == cases[1]["loss_step1"] > 0
    verdict = next(line for line in tiny_run.stdout.splitlines() if "auto should pick" in line)
    assert "tensorant/tiny-llama: grouped" in verdict and "it picked packed" in verdict
    assert "packed_flex" not in verdict  # nothing measured to compare
    assert "check_training: PASS (5/5 cases)" in tiny_run.stdout


def test_merged_case_times_verifies_and_compares_a_layer(tiny_run: TinyRun) -> None:
    merged = next(c for c in tiny_run.cases if c["merged"])
    assert merged["merged_ok"] and not merged["merged_problems"], merged
    # The trainer's merge ran (on the CPU: the run trained there) and was timed in its own process.
    assert merged["merge_device"] == "cpu" and merged["merge_s"] > 0
    assert merged["merge_peak_gpu_gib"] is None and merged["merge_fits_table"]
    # The archive as the agent exports it passed adapter_format.merged with its sha256, every tensor there.
    assert merged["merged_verified"] and merged["merged_tensors"] == 20 and merged["merged_dtypes"] == ["F32"]
    assert 0 < merged["merged_bytes"] < 2**20
    # fp32 on the CPU: the merged weight is base + B @ A x alpha/r (32/16) exactly.
    assert merged["merged_layer"] == MODULE and merged["merged_layer_scale"] == 2.0
    assert merged["merged_layer_max_err"] < 1e-6 < merged["merged_layer_max_delta"]
    line = next(line for line in tiny_run.stdout.splitlines() if line.startswith("check_training: merged "))
    assert f"archive {merged['merged_bytes']} bytes verified" in line
    assert f"{MODULE} = base + B @ A x 2 within bf16 rounding" in line


def _copy_merged(tiny_run: TinyRun, tmp_path: Path, dtype: str, change: str) -> tuple[Path, Path]:
    """(a base model folder, a trainer output) like the merged case's, the base and merged weights in
    dtype, the merged module's weight made `change`: "right" (base + B @ A x 2 rounded to dtype),
    "unmerged" (the base's) or "scale 1" (base + B @ A)."""
    import torch
    from safetensors.torch import load_file, save_file

    base_dir, out = tmp_path / "base", tmp_path / "out"
    shutil.copytree(tiny_run.model_dir, base_dir)
    shutil.copytree(tiny_run.merged_out, out)
    to = getattr(torch, dtype)
    base = {k: v.to(to) for k, v in load_file(base_dir / "model.safetensors").items()}
    save_file(base, base_dir / "model.safetensors")
    adapter = load_file(out / "adapter_model.safetensors")
    a = next(v for k, v in adapter.items() if k.endswith(f"{MODULE}.lora_A.weight")).float()
    b = next(v for k, v in adapter.items() if k.endswith(f"{MODULE}.lora_B.weight")).float()
    merged = {k: v.to(to) for k, v in load_file(out / "merged" / "model.safetensors").items()}
    w = base[f"{MODULE}.weight"].float()
    merged[f"{MODULE}.weight"] = {"right": w + (b @ a) * 2, "unmerged": w, "scale 1": w + b @ a}[change].to(to)
    save_file(merged, out / "merged" / "model.safetensors")
    return base_dir, out


@pytest.mark.parametrize(("dtype", "change", "ok"), [
    ("bfloat16", "right", True), ("bfloat16", "unmerged", False), ("bfloat16", "scale 1", False),
    ("float32", "unmerged", False)])
def test_layer_comparison_holds_bf16_rounding_and_refuses_a_wrong_merge(tiny_run: TinyRun, tmp_path: Path,
                                                                        dtype: str, change: str, ok: bool) -> None:
    from tests.gpu.check_training import merged_layer

    base_dir, out = _copy_merged(tiny_run, tmp_path, dtype, change)
    result = merged_layer(base_dir, out, MODULE)
    assert result["merged_layer_ok"] is ok, result
    if dtype == "bfloat16" and ok:
        assert 0 < result["merged_layer_max_err"]  # bf16 rounding was there to be tolerated


def test_merge_over_the_table_or_on_the_wrong_device_fails_the_case(tiny_run: TinyRun, tmp_path: Path) -> None:
    from tests.gpu.check_training import TINY as TINY_CASES
    from tests.gpu.check_training import merged_figures

    case = next(c for c in TINY_CASES if c.merged)
    timing = tmp_path / "merge.json"
    figures = {"merge_ok": True, "merge_device": "cuda", "merge_s": 1.0, "merge_peak_bytes": 3000,
               "held_at_merge_bytes": 0}
    timing.write_text(json.dumps(figures))
    over = merged_figures(case, tiny_run.model_dir, tiny_run.merged_out, timing, expect_device="cuda",
                          table_peak=2000)
    assert not over["merged_ok"] and not over["merge_fits_table"] and over["merge_peak_of_table"] == 1.5
    assert "over the table's 2000" in over["merged_problems"][0]
    timing.write_text(json.dumps({**figures, "merge_peak_bytes": None, "merge_device": "cpu"}))
    moved = merged_figures(case, tiny_run.model_dir, tiny_run.merged_out, timing, expect_device="cuda",
                           table_peak=2000)
    assert moved["merged_problems"] == ["the merge ran on cpu, not cuda"]
    timing.write_text(json.dumps({**figures, "merge_peak_bytes": 1500}))
    fits = merged_figures(case, tiny_run.model_dir, tiny_run.merged_out, timing, expect_device="cuda",
                          table_peak=2000)
    assert fits["merged_ok"] and fits["merged_verified"] and fits["merge_peak_of_table"] == 0.75, fits


def test_flex_against_segments_fails_a_flex_case_whose_first_loss_differs() -> None:
    """The GPU check's flex verdict, on figures as a device run reports them (flex trains on a GPU only)."""
    from tests.gpu.check_training import FLEX_LOSS_TOLERANCE, auto_verdicts, flex_verdicts

    def case(mode: str, loss: float, warm: float, **more: Any) -> dict[str, Any]:
        return {"case": mode, "model": "m", "mode": mode, "rc": 0, "ok": True, "merged": False, "loss_step1": loss,
                "real_tokens_per_s": warm / 2, "warm_tokens_per_s": warm, "padding_fraction": 0.0,
                "peak_gpu_gib": 2.0, "batching": "packed", **more}

    segments = case("packed", 2.0, 1000.0, attention="tensorant_segments")
    near = case("packed_flex", 2.0 * (1 + FLEX_LOSS_TOLERANCE / 2), 1500.0, attention="flex_attention")
    grouped = case("grouped", 2.5, 800.0, batching="grouped", padding_fraction=0.05)
    auto = case("auto", 2.0, 1490.0, attention="flex_attention", probe={"grouped": 1, "packed": 2, "packed_flex": 3})
    [line] = flex_verdicts([segments, near])
    assert near["ok"] and "= 1.50x" in line and "same attention" in line, line
    [line] = auto_verdicts([grouped, segments, near, auto])
    assert "auto should pick packed_flex; it picked packed_flex (the fastest)" in line, line
    far = case("packed_flex", 2.0 * (1 + 2 * FLEX_LOSS_TOLERANCE), 1500.0, attention="flex_attention")
    [line] = flex_verdicts([segments, far])
    assert not far["ok"] and "NOT the same attention" in line, line
    slow = {**auto, "attention": "tensorant_segments"}
    [line] = auto_verdicts([grouped, segments, near, slow])
    assert "it picked packed (NOT the fastest)" in line, line
