"""GPU check: real LoRA training at real model dimensions on one H100/H200, no hub access, < 5 minutes.

    python -m tests.gpu.check_training            # Qwen2.5-0.5B and Llama-3.1-8B shapes, bf16 and 4-bit
    python -m tests.gpu.check_training --tiny     # the same code path on the CPU with the tiny model

Random weights at each declared shape (shared.adapters.base_models), a generated dataset, the real
trainer subprocess (`python -m shared.trainer.lora`, the agent's environment contract), then the
verifier on the exported archive. Prints per case the figures tests/bench/trainers_bench.py gives
on the CPU: the batching mode, real (non-padding) and trained tokens per second of the training loop
(and per CPU-second), the padding fraction, loss first -> last, and peak GPU memory
(torch.cuda.max_memory_allocated, from the manifest) against the base-model memory table's estimate
(shared.adapters.base_models). The Qwen2.5-0.5B bf16 case runs twice, grouped and packed, so the
GPU's own choice for `batching: auto` under sdpa can be checked. Exits non-zero unless every case
verifies and its loss falls. (4-bit cases need bitsandbytes and CUDA; they are skipped with --tiny.)
"""

from __future__ import annotations

import argparse
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


FULL = [
    Case("Qwen/Qwen2.5-0.5B-Instruct", False, 30, 4, 512, "grouped"),
    Case("Qwen/Qwen2.5-0.5B-Instruct", False, 30, 4, 512, "packed"),
    Case("Qwen/Qwen2.5-0.5B-Instruct", True, 30, 4, 512),
    Case("meta-llama/Llama-3.1-8B-Instruct", False, 20, 2, 512),
    Case("meta-llama/Llama-3.1-8B-Instruct", True, 20, 2, 512),
]
TINY = [Case("tensorant/tiny-llama", False, 16, 4, 64)]


def dataset_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """A learnable style: every answer has the same shape, so loss must fall within a few steps; its
    length varies (1 to 12 repeats), so the batching modes differ in padding as on real chat data."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        answer = f"Arr, {a} plus {b} be {a + b}, matey! " * rng.randint(1, 12)
        rows.append({"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                                  {"role": "assistant", "content": answer}]})
    return rows


def figures(manifest: dict[str, Any], estimate_bytes: int) -> dict[str, Any]:
    """The throughput and memory figures of one trainer run, from its manifest.json."""
    from shared.adapters.base_models import GiB

    seconds, cpu = manifest["train_seconds"], manifest.get("train_cpu_seconds")
    peak = manifest.get("peak_gpu_memory_bytes")
    return {"batching": manifest["batching"], "real_tokens_per_s": manifest["tokens_per_s"],
            "trained_tokens_per_s": round(manifest["trained_tokens"] / seconds, 1) if seconds else None,
            "real_tokens_per_cpu_s": round(manifest["tokens"] / cpu, 1) if cpu else None,
            "padding_fraction": manifest["padding_fraction"], "train_s": seconds,
            "peak_gpu_gib": round(peak / GiB, 2) if peak else None, "estimate_gib": round(estimate_bytes / GiB, 2),
            "peak_of_estimate": round(peak / estimate_bytes, 2) if peak else None}


def export_zip(out: Path) -> bytes:
    """The archive as the agent uploads it (zipfile entries of the three files)."""
    target = out / "adapter.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in ("adapter_config.json", "adapter_model.safetensors", "manifest.json"):
            zf.write(out / name, name)
    return target.read_bytes()


def run_case(case: Case, work: Path, *, device: str, threads: int | None) -> dict[str, Any]:
    from shared.adapters.base_models import get_base_model
    from shared.adapters.verify import verify_adapter
    from shared.trainer.random_model import build_random_model

    spec = get_base_model(case.base_model)
    assert spec is not None
    slug = case.base_model.replace("/", "--")
    model_dir = work / f"model-{slug}"
    t0 = time.monotonic()
    if not (model_dir / "config.json").exists():
        corpus = [json.dumps(r) for r in dataset_rows(50)]
        build_random_model(case.base_model, model_dir, seed=0, corpus=corpus, device=device,
                           dtype="bfloat16" if device == "cuda" else "float32", vocab_size=2000)
    built = time.monotonic() - t0
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()  # the trainer subprocess needs the memory, not this process
    dataset = work / "data.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in dataset_rows(200)))
    out = work / f"out-{slug}-{'4bit' if case.load_in_4bit else 'bf16'}-{case.batching}"
    shutil.rmtree(out, ignore_errors=True)
    training = {"max_steps": case.steps, "batch_size": case.batch_size, "max_seq_len": case.seq_len,
                "learning_rate": 0.003, "lora_r": 16, "lora_alpha": 32, "target_modules": "all-linear",
                "load_in_4bit": case.load_in_4bit, "warmup_ratio": 0.1, "sample_prompts": 1, "seed": 1,
                "batching": case.batching}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORANT_") and k != "HF_TOKEN"}
    env.update(TENSORANT_OUTPUT_DIR=str(out), TENSORANT_DATASET_PATH=str(dataset),
               TENSORANT_BASE_MODEL=case.base_model, TENSORANT_BASE_MODEL_PATH=str(model_dir),
               TENSORANT_TRAINING=json.dumps(training), PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    if threads:
        env["TENSORANT_TORCH_THREADS"] = str(threads)
    t1 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "shared.trainer.lora"], env=env, cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    wall = time.monotonic() - t1
    result: dict[str, Any] = {"case": f"{case.base_model} {'4-bit' if case.load_in_4bit else 'bf16/fp32'} "
                                      f"batching={case.batching}",
                              "build_s": round(built, 1), "trainer_wall_s": round(wall, 1), "rc": proc.returncode}
    if proc.returncode != 0:
        result["ok"] = False
        result["log_tail"] = proc.stdout[-2000:]
        return result
    manifest = json.loads((out / "manifest.json").read_text())
    loss = manifest["loss"]
    k = max(1, len(loss) // 4)
    first, last = sum(loss[:k]) / k, sum(loss[-k:]) / k
    verdict = verify_adapter(export_zip(out), base_model=case.base_model, expected_sha256=None, provider="runpod")
    estimate = spec.estimate_memory(batch_size=case.batch_size, seq_len=case.seq_len, lora_r=16,
                                    target_modules="all-linear", load_in_4bit=case.load_in_4bit)
    result.update(figures(manifest, estimate), loss_first=round(first, 4), loss_last=round(last, 4),
                  precision=manifest["precision"], device=manifest["device"], verified=verdict.ok,
                  problems=verdict.problems[:3], loss_falls=last < first)
    result["ok"] = bool(verdict.ok and last < first)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU path check with the tiny model")
    parser.add_argument("--work", default="", help="working directory (default: a temporary one)")
    parser.add_argument("--only", default="", help="run only cases whose model id contains this")
    args = parser.parse_args(argv)
    import torch

    if not args.tiny and not torch.cuda.is_available():
        print("check_training: no CUDA GPU here; use --tiny for the CPU code path", flush=True)
        return 2
    cases = [c for c in (TINY if args.tiny else FULL) if args.only in c.base_model]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tensorant-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for case in cases:
        r = run_case(case, work, device="cpu" if args.tiny else "cuda", threads=1 if args.tiny else None)
        print(json.dumps(r), flush=True)
        results.append(r)
    ok = bool(results) and all(r["ok"] for r in results)
    print(f"check_training: {'PASS' if ok else 'FAIL'} ({sum(r['ok'] for r in results)}/{len(results)} cases)",
          flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
