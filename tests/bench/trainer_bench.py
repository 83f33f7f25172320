"""Trainer throughput on the CPU for the tiny model: steps/s and tokens/s (not part of the test run).

    python -m tests.bench.trainer_bench [--steps 60] [--threads 1]

Builds the tiny random Llama, runs the real trainer subprocess with the agent's environment
contract, and prints the trainer's own figures (from manifest.json) and the process wall time
(imports included), so the import cost and the training cost are seen separately.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = "tensorant/tiny-llama"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args(argv)
    from shared.trainer.random_model import build_random_model
    from tests.trainer.conftest import pirate_rows, write_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = pirate_rows(64)
        model = build_random_model(MODEL, work / "model", corpus=[json.dumps(r) for r in rows])
        dataset = write_jsonl(work / "data.jsonl", rows)
        training = {"max_steps": args.steps, "batch_size": 8, "max_seq_len": args.seq_len, "learning_rate": 0.005,
                    "lora_r": 8, "target_modules": "all-linear", "sample_prompts": 0, "eval_fraction": 0.0}
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORANT_")}
        env.update(TENSORANT_OUTPUT_DIR=str(work / "out"), TENSORANT_DATASET_PATH=str(dataset),
                   TENSORANT_BASE_MODEL=MODEL, TENSORANT_BASE_MODEL_PATH=str(model),
                   TENSORANT_TRAINING=json.dumps(training), TENSORANT_TORCH_THREADS=str(args.threads),
                   PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "shared.trainer.lora"], env=env, cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wall = time.monotonic() - started
        if proc.returncode != 0:
            print(proc.stdout[-3000:])
            return 1
        m = json.loads((work / "out" / "manifest.json").read_text())
    print(f"trainer_bench: model={MODEL} steps={m['steps']} batch=8 seq<={args.seq_len} threads={args.threads}")
    print(f"  training: {m['train_seconds']:.2f} s, {m['steps'] / m['train_seconds']:.1f} steps/s, "
          f"{m['tokens_per_s']:.0f} tokens/s ({m['tokens']} tokens)")
    print(f"  process wall (imports, load, save included): {wall:.1f} s; loss {m['loss'][0]:.3f} -> {m['loss'][-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
