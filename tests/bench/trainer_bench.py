"""Trainer throughput on the CPU for the tiny model: steps/s and tokens/s (not part of the test run).

    python -m tests.bench.trainer_bench [--steps 60] [--threads 1] [--batching padded,grouped,packed]
    python -m tests.bench.trainer_bench --memory      # peak RSS of one step, full logits vs chunked loss

Builds the tiny random Llama, runs the real trainer subprocess with the agent's environment
contract once per batching mode on chat rows whose answers vary from a few to a few hundred
tokens, and prints the trainer's own figures (from manifest.json: real and processed tokens/s,
padding fraction) and the process wall time (imports included).

--memory: one forward+backward of a Qwen2 of hidden 64 with a 151,936-token vocabulary (as
Qwen2.5), batch 4 x 512 tokens all learned, in a fresh process per variant; prints ru_maxrss.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = "tensorant/tiny-llama"


WORDS = ["arr", "matey", "the", "ship", "sails", "north", "by", "star", "and", "crew", "sings", "of", "gold", "rum"]


def chat_rows(n: int, seed: int = 0) -> list[dict[str, object]]:
    """Short questions, answers of 3 to 120 words (about 10 to 400 tokens with the tiny tokenizer)."""
    rng = random.Random(seed)
    return [{"prompt": f"Tell me about {rng.choice(WORDS)} {i}.",
             "completion": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 120)))} for i in range(n)]


def memory_child(variant: str) -> int:
    """One training step's peak RSS: `plain` (transformers' loss over full logits) or `chunked`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from machine.trainer.batches import collate, trained_tokens
    from machine.trainer.data import Tokenized
    from machine.trainer.loss import loss_sum

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    rng = random.Random(0)
    batch = [Tokenized(ids, ids) for ids in ([rng.randrange(151936) for _ in range(512)] for _ in range(4))]
    inputs = collate(batch, 0, "cpu", "padded")
    n = trained_tokens(batch)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loss = model(**inputs).loss * n if variant == "plain" else loss_sum(model, inputs, n)
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"  {variant:8s} loss/token {float(loss) / n:.4f}  peak RSS {peak / 1024:.0f} MiB "
          f"(model loaded: {before / 1024:.0f} MiB, step adds {(peak - before) / 1024:.0f} MiB)")
    return 0


def memory() -> int:
    print("trainer_bench --memory: Qwen2 hidden 64, vocab 151936, batch 4 x 512 learned tokens, one step")
    for variant in ("plain", "chunked"):
        proc = subprocess.run([sys.executable, "-m", "tests.bench.trainer_bench", "--memory-child", variant],
                              cwd=REPO, text=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        print(proc.stdout.rstrip() or proc.stderr[-2000:])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batching", default="padded,grouped,packed")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--memory-child", choices=("plain", "chunked"))
    args = parser.parse_args(argv)
    if args.memory_child:
        return memory_child(args.memory_child)
    if args.memory:
        return memory()
    for batching in args.batching.split(","):
        if run(args, batching):
            return 1
    return 0


def run(args: argparse.Namespace, batching: str) -> int:
    from machine.trainer.random_model import build_random_model
    from tests.trainer.conftest import write_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = chat_rows(256)
        model = build_random_model(MODEL, work / "model", corpus=[json.dumps(r) for r in rows])
        dataset = write_jsonl(work / "data.jsonl", rows)
        training = {"max_steps": args.steps, "batch_size": 8, "max_seq_len": args.seq_len, "learning_rate": 0.005,
                    "lora_r": 8, "target_modules": "all-linear", "sample_prompts": 0, "eval_fraction": 0.0,
                    "batching": batching}
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORANT_")}
        env.update(TENSORANT_OUTPUT_DIR=str(work / "out"), TENSORANT_DATASET_PATH=str(dataset),
                   TENSORANT_BASE_MODEL=MODEL, TENSORANT_BASE_MODEL_PATH=str(model),
                   TENSORANT_TRAINING=json.dumps(training), TENSORANT_TORCH_THREADS=str(args.threads),
                   PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "machine.trainer.lora"], env=env, cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wall = time.monotonic() - started
        if proc.returncode != 0:
            print(proc.stdout[-3000:])
            return 1
        m = json.loads((work / "out" / "manifest.json").read_text())
    print(f"trainer_bench: model={MODEL} batching={m['batching']} steps={m['steps']} batch=8 "
          f"seq<={args.seq_len} threads={args.threads}")
    print(f"  training: {m['train_seconds']:.2f} s, {m['steps'] / m['train_seconds']:.2f} steps/s, "
          f"{m['tokens_per_s']:.0f} tokens/s ({m['tokens']} tokens), processed {m['processed_tokens_per_s']:.0f} "
          f"tokens/s, padding {m['padding_fraction']:.1%}")
    print(f"  process wall (imports, load, save included): {wall:.1f} s; loss {m['loss'][0]:.3f} -> {m['loss'][-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
