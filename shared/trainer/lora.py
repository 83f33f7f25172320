"""The real trainer: a LoRA fine-tune with transformers + peft (`python -m shared.trainer.lora`).

Environment (the agent -> trainer contract; shared/agent passes it):
  TENSORANT_OUTPUT_DIR       writes adapter_config.json, adapter_model.safetensors, manifest.json
  TENSORANT_DATASET_PATH     JSONL; rows {"messages"}, {"prompt","completion"} or {"text"}
  TENSORANT_BASE_MODEL       the run's declared base model id (written into adapter_config.json)
  TENSORANT_BASE_MODEL_PATH  optional local model directory; otherwise the hub id is downloaded
  TENSORANT_TRAINING         JSON training settings (shared.trainer.config); missing = defaults
  HF_TOKEN                   optional hub token for gated models; handed to the hub client only
  TENSORANT_TORCH_THREADS    optional CPU thread count (tiny models on a busy CPU run several
                             times faster on one thread than on two contended ones)
  TENSORANT_CHECKPOINT_DIR   optional (the agent sets <data dir>/checkpoint): every
                             checkpoint_every_steps steps or checkpoint_every_s seconds the adapter
                             files, manifest.json (with checkpoint_step) and trainer_state.pt
                             (optimizer, scheduler, RNG, counters) are written to <dir>/.partial,
                             fsynced and renamed to <dir>/step-<k>; older step folders are then
                             removed, so one complete checkpoint always exists. Prints
                             `checkpoint step=<k> dir=<path>`.
  TENSORANT_RESUME_FROM      optional: a step-<k> folder; training continues at step k+1 with
                             that adapter and optimizer state, skipping the first k steps of the
                             same seeded data order (settings must match the checkpoint's)
  TENSORANT_TEST_STEP_SLEEP_S  tests only: sleep this long after each step (a run slow enough to
                             hit its time limit mid-training)

A plain loop (torch AdamW + warmup/cosine schedule) rather than HF Trainer: fewer moving parts,
exact control of the loss mask, the progress lines and determinism. Micro-batches are packed or
length-grouped (shared.trainer.batches, the `batching` setting) and the loss is a chunked
cross-entropy over the learned positions only (shared.trainer.loss): no full logits tensor. It prints
`progress=<0..1> step=<n> loss=<x> lr=<y>` per optimizer step. Exit codes: 0 adapter written,
2 bad settings or dataset, 3 model could not be loaded, 1 anything else.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import platform
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from shared.trainer.batches import batch_stream, choose_batching, collate, trained_tokens
from shared.trainer.config import SettingsError, TrainerSettings, parse_settings
from shared.trainer.data import DatasetError, Encoded, Example, Tokenized, encode_all, load_examples, sample_prompt
from shared.trainer.loss import loss_sum

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
MANIFEST_NAME = "manifest.json"
STATE_NAME = "trainer_state.pt"
TRAINER = "lora"
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_LINEAR = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]
MIN_EVAL_EXAMPLES = 20  # the contract: a held-out split only from this many examples up
MAX_EVAL_EXAMPLES = 256  # eval is a check, not a second training pass
MAX_LOSS_POINTS = 5000  # keeps manifest.json well under the verifier's 1 MiB JSON limit
SAMPLE_NEW_TOKENS = 48


def log(message: str) -> None:
    print(message, flush=True)


def split(examples: list[Example], s: TrainerSettings) -> tuple[list[Example], list[Example], list[Example]]:
    """(train, eval, sample) with a seeded shuffle: the same seed always holds out the same rows."""
    rng = random.Random(s.seed)
    order = list(examples)
    rng.shuffle(order)
    if s.max_examples is not None:
        order = order[: s.max_examples]
    n_eval = 0
    if len(order) >= MIN_EVAL_EXAMPLES and s.eval_fraction > 0:
        n_eval = min(MAX_EVAL_EXAMPLES, max(1, int(len(order) * s.eval_fraction)))
    held, train = order[:n_eval], order[n_eval:]
    # Sample prompts come from the held-out rows when there are any (the model never saw them),
    # else from the training rows (then they show what it learned, not how it generalises).
    samples = (held or train)[: s.sample_prompts]
    return train, held, samples


def plan_steps(n_train: int, s: TrainerSettings) -> int:
    micro_per_epoch = math.ceil(n_train / s.batch_size)
    steps_per_epoch = max(1, math.ceil(micro_per_epoch / s.gradient_accumulation))
    if s.max_steps is not None:
        return s.max_steps
    return max(1, math.ceil(s.epochs * steps_per_epoch))


def choose_precision(s: TrainerSettings, cuda: bool) -> str:
    if s.precision != "auto":
        return s.precision
    import torch

    return "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"


def load_model(s: TrainerSettings, source: str, precision: str, cuda: bool, token: str | None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if precision == "bf16" else torch.float32, "token": token}
    if s.load_in_4bit:
        if not cuda:
            raise SettingsError("training.load_in_4bit needs a CUDA GPU (bitsandbytes); this machine has none")
        import bitsandbytes  # noqa: F401  (imported only when asked: a clear error if the image lacks it)
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
        kwargs["device_map"] = {"": 0}
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if cuda and not s.load_in_4bit:
        model.to("cuda")  # type: ignore[arg-type]  # transformers types .to() as a wrapped method
    return model


def evaluate(model: Any, examples: list[Tokenized], batch_size: int, pad_id: int, device: Any, mode: str,
             capacity: int) -> float | None:
    import torch

    if not examples:
        return None
    model.eval()
    total, count = 0.0, 0
    # Token-weighted, so the order does not change the result: by length, for the least padding.
    ordered = sorted(examples, key=lambda t: len(t.input_ids))
    with torch.no_grad():
        for i in range(0, len(ordered), batch_size):
            batch = ordered[i: i + batch_size]
            n = trained_tokens(batch)
            if n == 0:
                continue
            total += float(loss_sum(model, collate(batch, pad_id, device, mode, capacity), n))
            count += n
    model.train()
    return total / count if count else None


def generate(model: Any, tokenizer: Any, prompt: str, device: Any, *, chat: bool) -> str:
    import torch

    # A rendered chat prompt already holds its special tokens, as in training.
    ids = tokenizer(prompt, add_special_tokens=not chat, return_tensors="pt").to(device)
    if ids["input_ids"].shape[1] == 0:
        return ""
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=SAMPLE_NEW_TOKENS, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)).strip()


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "safetensors", "tokenizers", "accelerate", "bitsandbytes"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def adapter_files(scratch: Path, model: Any, base_model: str, targets: list[str],
                  manifest: dict[str, Any]) -> dict[str, bytes]:
    """adapter_config.json (deterministic: sorted keys, sorted targets, the run's model id),
    adapter_model.safetensors (PEFT's own writer) and manifest.json with both files' sha256.
    scratch: an empty folder PEFT writes into first; removed afterwards."""
    model.save_pretrained(scratch, safe_serialization=True)
    config = json.loads((scratch / CONFIG_NAME).read_text())
    # PEFT writes the directory it loaded from, and target_modules from a set (order varies).
    config["base_model_name_or_path"] = base_model
    config["target_modules"] = sorted(config.get("target_modules") or targets)
    files = {CONFIG_NAME: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
             WEIGHTS_NAME: (scratch / WEIGHTS_NAME).read_bytes()}
    manifest["files"] = {name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                         for name, data in sorted(files.items())}
    files[MANIFEST_NAME] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    shutil.rmtree(scratch)
    return files


def write_outputs(out: Path, model: Any, base_model: str, targets: list[str], manifest: dict[str, Any]) -> None:
    files = adapter_files(out / ".peft", model, base_model, targets, manifest)
    for name, data in files.items():
        part = out / (name + ".tmp")
        part.write_bytes(data)
        part.replace(out / name)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(root: Path, step: int, files: dict[str, bytes]) -> Path:
    """root/step-<step> holding files, made whole before it gets its name: written to root/.partial,
    each file and the folder fsynced, then renamed. Older step folders go only after that, so a
    machine stopped (or a trainer killed) at any moment leaves at least one complete checkpoint."""
    root.mkdir(parents=True, exist_ok=True)
    partial = root / ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for name, data in files.items():
        with open(partial / name, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    _fsync_dir(partial)
    final = root / f"step-{step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    _fsync_dir(root)
    for old in root.glob("step-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_manifest(base_model: str, step: int, total_steps: int, s: TrainerSettings) -> dict[str, Any]:
    """What a checkpoint's manifest.json says: enough for the verifier (trainer, base model, files) and
    for a reader to tell it from a final adapter (checkpoint_step of steps)."""
    return {"format": 1, "trainer": TRAINER, "base_model": base_model, "kind": s.kind, "checkpoint_step": step,
            "steps": total_steps, "settings": s.as_dict()}


def train(env: dict[str, str]) -> int:
    started = time.monotonic()
    output, dataset = env.get("TENSORANT_OUTPUT_DIR", ""), env.get("TENSORANT_DATASET_PATH", "")
    base_model = env.get("TENSORANT_BASE_MODEL", "")
    if not (output and dataset and base_model):
        log("trainer: TENSORANT_OUTPUT_DIR, TENSORANT_DATASET_PATH and TENSORANT_BASE_MODEL must be set")
        return 2
    try:
        s, warnings = parse_settings(env.get("TENSORANT_TRAINING"))
        examples = load_examples(dataset)
    except (SettingsError, DatasetError, OSError) as exc:
        log(f"trainer: {exc}")
        return 2
    for w in warnings:
        log(f"trainer: warning: {w}")
    checkpoint_root = Path(env["TENSORANT_CHECKPOINT_DIR"]) if env.get("TENSORANT_CHECKPOINT_DIR") else None
    resume_from = Path(env["TENSORANT_RESUME_FROM"]) if env.get("TENSORANT_RESUME_FROM") else None
    if resume_from is not None:
        try:
            saved = json.loads((resume_from / MANIFEST_NAME).read_text())
        except (OSError, ValueError) as exc:
            log(f"trainer: cannot resume from {resume_from}: {exc}")
            return 2
        # Another base model, seed, batch size or step plan would make "the same data order" false.
        if saved.get("base_model") != base_model or saved.get("settings") != s.as_dict():
            log(f"trainer: cannot resume from {resume_from}: it was written for other settings or another model")
            return 2
    step_sleep_s = float(env.get("TENSORANT_TEST_STEP_SLEEP_S") or 0)

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, get_cosine_schedule_with_warmup

    if env.get("TENSORANT_TORCH_THREADS", "").isdigit() and int(env["TENSORANT_TORCH_THREADS"]) > 0:
        torch.set_num_threads(int(env["TENSORANT_TORCH_THREADS"]))
    torch.manual_seed(s.seed)
    random.seed(s.seed)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    precision = choose_precision(s, cuda)
    source = env.get("TENSORANT_BASE_MODEL_PATH") or base_model
    token = env.get("HF_TOKEN") or None
    train_rows, eval_rows, sample_rows = split(examples, s)
    log(f"trainer: lora kind={s.kind} base_model={base_model} rows={len(examples)} train={len(train_rows)} "
        f"eval={len(eval_rows)} device={device.type} precision={precision} 4bit={s.load_in_4bit}")
    if s.kind == "trial" or s.max_examples is not None:
        log(f"trainer: trial run: training on a sample of {len(train_rows)} of the dataset's {len(examples)} rows")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, token=token)
        model = load_model(s, source, precision, cuda, token)
    except SettingsError as exc:
        log(f"trainer: {exc}")
        return 2
    except (OSError, ValueError, ImportError) as exc:
        # Never echo the token: the exception text carries the model id and the hub's reason only.
        log(f"trainer: could not load base model {base_model!r} from {source!r}: {exc}")
        return 3
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)

    encoded: Encoded = encode_all(tokenizer, train_rows, s.max_seq_len)
    held: Encoded = encode_all(tokenizer, eval_rows, s.max_seq_len)
    if not encoded.examples:
        log("trainer: no training example has a token to learn from (all empty or cut off by max_seq_len)")
        return 2
    # Both counts per split: training rows in `truncated`/`dropped`, held-out rows in `eval_*`.
    for name, part in (("training", encoded), ("held-out", held)):
        if part.truncated:
            log(f"trainer: {part.truncated} {name} example(s) were longer than max_seq_len={s.max_seq_len} "
                "and were truncated")
        if part.dropped:
            log(f"trainer: {part.dropped} {name} example(s) had no assistant/completion token within "
                "max_seq_len and were skipped")

    if s.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=s.gradient_checkpointing)
    if s.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    batching = choose_batching(s.batching, model.config.model_type, getattr(model.config, "_attn_implementation", None))
    targets = ALL_LINEAR if s.target_modules == "all-linear" else ATTENTION
    torch.manual_seed(s.seed)  # the LoRA init draws from here: same seed, same adapter
    model = get_peft_model(model, LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout,
                                             target_modules=targets, bias="none", task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total_steps = plan_steps(len(encoded.examples), s)
    warmup = round(s.warmup_ratio * total_steps)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=s.learning_rate,
                                  weight_decay=0.0)
    scheduler = get_cosine_schedule_with_warmup(optimizer, warmup, total_steps)
    log(f"trainer: steps={total_steps} warmup={warmup} batch={s.batch_size}x{s.gradient_accumulation} "
        f"lora r={s.lora_r} alpha={s.lora_alpha} targets={','.join(targets)} trainable_params={trainable} "
        f"batching={batching}")

    stream = batch_stream(encoded.examples, s.batch_size, s.seed, grouped=batching == "grouped")
    losses: list[float] = []
    tokens_seen = processed = trained = 0
    epoch = 0
    first_step = 1
    if resume_from is not None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(model, load_file(resume_from / WEIGHTS_NAME, device=str(device)))
        state = torch.load(resume_from / STATE_NAME, map_location=device, weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"].cpu())  # dropout draws continue where they stopped
        if cuda and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"].cpu())
        eval_before, losses, epoch = state["eval_before"], list(state["losses"]), int(state["epoch"])
        tokens_seen, processed, trained = (int(state[k]) for k in ("tokens_seen", "processed", "trained"))
        first_step = int(state["step"]) + 1
        # The stream is seeded: drawing (and dropping) the micro-batches of the steps already done
        # puts it exactly where the interrupted run was.
        for _ in range((first_step - 1) * s.gradient_accumulation):
            next(stream)
        log(f"trainer: resumed from {resume_from} at step {first_step} of {total_steps}")
    else:
        eval_before = evaluate(model, held.examples, s.batch_size, pad_id, device, batching, s.max_seq_len)
        if eval_before is not None:
            log(f"trainer: eval_loss before training = {eval_before:.4f}")
    model.train()
    train_started = last_checkpoint = time.monotonic()
    for step in range(first_step, total_steps + 1):
        group = [next(stream) for _ in range(s.gradient_accumulation)]
        epoch = group[-1][0]
        n_step = sum(trained_tokens(b) for _, b in group) or 1
        step_loss = 0.0
        for _, batch in group:
            n = trained_tokens(batch)
            if n == 0:
                continue
            inputs = collate(batch, pad_id, device, batching, s.max_seq_len)
            # Token-weighted over the whole accumulated step, not a mean of micro-batch means.
            loss = loss_sum(model, inputs, n) / n_step
            loss.backward()
            step_loss += float(loss.detach())
            tokens_seen += sum(len(t.input_ids) for t in batch)  # real tokens
            processed += inputs["input_ids"].numel()  # what the model computed, padding included
            trained += n
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if not math.isfinite(step_loss):
            log(f"trainer: loss became {step_loss} at step {step}; lower learning_rate and train again")
            return 1
        losses.append(step_loss)
        log(f"progress={step / total_steps:.4f} step={step} loss={step_loss:.4f} "
            f"lr={scheduler.get_last_lr()[0]:.3e} epoch={epoch}")
        if step_sleep_s:
            time.sleep(step_sleep_s)
        due = step % s.checkpoint_every_steps == 0 or time.monotonic() - last_checkpoint >= s.checkpoint_every_s
        if checkpoint_root is not None and step < total_steps and due:
            # The last step needs none: the final adapter is written right after it.
            snapshot = {"step": step, "seed": s.seed, "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(),
                     "cuda_rng": torch.cuda.get_rng_state() if cuda else None, "eval_before": eval_before,
                     "losses": losses, "epoch": epoch, "tokens_seen": tokens_seen, "processed": processed,
                     "trained": trained}
            blob = io.BytesIO()
            torch.save(snapshot, blob)
            files = adapter_files(checkpoint_root / ".peft", model, base_model, targets,
                                  checkpoint_manifest(base_model, step, total_steps, s))
            where = write_checkpoint(checkpoint_root, step, {**files, STATE_NAME: blob.getvalue()})
            last_checkpoint = time.monotonic()
            log(f"checkpoint step={step} dir={where}")
    train_seconds = time.monotonic() - train_started

    eval_after = evaluate(model, held.examples, s.batch_size, pad_id, device, batching, s.max_seq_len)
    if eval_after is not None:
        log(f"trainer: eval_loss after training = {eval_after:.4f}")
    samples = []
    model.eval()
    model.config.use_cache = True
    for ex in sample_rows:
        prompt, expected = sample_prompt(tokenizer, ex)
        chat = ex.messages is not None
        tuned = generate(model, tokenizer, prompt, device, chat=chat)
        with model.disable_adapter():
            base = generate(model, tokenizer, prompt, device, chat=chat)
        samples.append({"prompt": prompt[-2000:], "expected": expected[:2000], "base": base, "adapter": tuned})
        log(f"sample prompt: {prompt!r}")
        log(f"sample base model: {base!r}")
        log(f"sample with adapter: {tuned!r}")
        log(f"sample dataset answer: {expected!r}")

    every = max(1, math.ceil(len(losses) / MAX_LOSS_POINTS))
    manifest: dict[str, Any] = {
        "format": 1,
        "trainer": TRAINER,
        "base_model": base_model,
        "rows": len(examples),
        "kind": s.kind,
        "train_examples": len(encoded.examples),
        "eval_examples": len(held.examples),
        "steps": total_steps,
        "epochs_seen": epoch + 1,
        "tokens": tokens_seen,
        "trained_tokens": trained,
        "loss": [round(x, 5) for x in losses[::every]],
        "loss_every": every,
        "eval_loss_before": eval_before,
        "eval_loss": eval_after,
        # Per split: truncated/dropped count training rows, eval_truncated/eval_dropped held-out rows.
        "truncated": encoded.truncated,
        "dropped": encoded.dropped,
        "eval_truncated": held.truncated,
        "eval_dropped": held.dropped,
        "row_counts": "truncated and dropped count training rows; eval_truncated and eval_dropped held-out rows",
        "batching": batching,
        "processed_tokens": processed,
        "padding_fraction": round(1 - tokens_seen / processed, 4) if processed else 0.0,
        "trainable_params": trainable,
        "train_seconds": round(train_seconds, 3),
        "duration_s": round(time.monotonic() - started, 3),
        "tokens_per_s": round(tokens_seen / train_seconds, 1) if train_seconds > 0 else None,
        "processed_tokens_per_s": round(processed / train_seconds, 1) if train_seconds > 0 else None,
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.machine()})",
        "precision": precision,
        "peak_gpu_memory_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None,
        "versions": versions(),
        "settings": s.as_dict(),
        "target_modules": targets,
        "samples": samples,
    }
    if resume_from is not None:
        manifest["resumed_from_step"] = first_step - 1
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, model, base_model, targets, manifest)
    log(f"trainer: wrote {CONFIG_NAME}, {WEIGHTS_NAME}, {MANIFEST_NAME} to {out} "
        f"(loss {losses[0]:.4f} -> {losses[-1]:.4f}, {tokens_seen} tokens in {train_seconds:.1f}s)")
    return 0


def main() -> int:
    return train(dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
