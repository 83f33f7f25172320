"""The real trainer: a LoRA fine-tune with transformers + peft (`python -m machine.trainer.lora`).

Environment (the agent -> trainer contract; machine/agent passes it):
  TENSORANT_OUTPUT_DIR       writes adapter_config.json, adapter_model.safetensors, manifest.json (and with
                             training.merged, the adapter merged into the base model in merged/:
                             machine.trainer.merge)
  TENSORANT_DATASET_PATH     JSONL; rows {"messages"}, {"prompt","completion"} or {"text"}
  TENSORANT_EVAL_DATASET_PATH  optional JSONL of the same kinds: the held-out split (its first rows, up to
                             the usual cap) instead of eval_fraction of the training rows, which all train
  TENSORANT_BASE_MODEL       the run's declared base model id (written into adapter_config.json)
  TENSORANT_BASE_MODEL_PATH  optional local model directory; otherwise the hub id is downloaded
  TENSORANT_BASE_MODEL_REVISION  optional: the hub revision (commit id) to download
  TENSORANT_TRAINING         JSON training settings (machine.trainer.config); missing = defaults
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
length-grouped (machine.trainer.batches, the `batching` setting) and the loss is a chunked
cross-entropy over the learned positions only (machine.trainer.loss): no full logits tensor. It prints
`progress=<0..1> step=<n> loss=<x> lr=<y>` per optimizer step and, with eval_every_steps,
`eval step=<n> eval_loss=<x>` per evaluation (early stopping and the best adapter kept: the settings
of machine.trainer.config). With method dpo the rows are preference pairs (machine.trainer.dpo: padded
batches, the loss the mean DPO loss over the step's pairs) and each eval line adds
`preference_accuracy=<a> reward_margin=<m>`; checkpoints, resume, keep_best and the merged model are
the same code as SFT's. Exit codes: 0 adapter written, 2 bad settings or dataset, 3 model could
not be loaded, 4 the machine's GPU cannot be used (machine.trainer.gpu: a driver older than torch's
CUDA needs), 1 anything else.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import os
import platform
import random
import shutil
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from machine.trainer import dpo, merge, tracking
from machine.trainer.batches import (
    FLEX,
    SEGMENTS,
    batch_stream,
    candidates,
    choose_batching,
    collate,
    flex_trainable,
    set_attention,
    trained_tokens,
    use_segment_attention,
    wants_probe,
)
from machine.trainer.config import SettingsError, TrainerSettings, parse_settings
from machine.trainer.data import DatasetError, DatasetRows, Encoded, Example, Tokenized, sample_prompt, scan_dataset
from machine.trainer.encoding import encode_splits, with_inputs
from machine.trainer.gpu import EXIT_GPU, Neftune, choice_name, gpu_problem, probe_batching
from machine.trainer.loss import loss_sum
from machine.trainer.templates import TemplateError
from machine.trainer.templates import apply as apply_template

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
MANIFEST_NAME = "manifest.json"
EXIT_STOPPED = 143  # stopped by SIGTERM during training (128 + 15, as a process killed by it reports)
# Printed once the final adapter is in the output directory, before the final eval and samples (the agent
# uploads it at this line: machine/agent/trainer.py matches it).
FINAL_WRITTEN = "trainer: final adapter written"
STATE_NAME = "trainer_state.pt"
WARM_STEPS = 2  # steps left out of tokens_per_s_warm (the first: kernels load; under flex, compiling twice)
TRAINER = "lora"
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_LINEAR = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]
FUSED_ATTENTION = ["qkv_proj", "o_proj"]
FUSED_ALL_LINEAR = [*FUSED_ATTENTION, "gate_up_proj", "down_proj"]
MIN_EVAL_EXAMPLES = 20  # the contract: a held-out split only from this many examples up
MAX_EVAL_EXAMPLES = 256  # eval is a check, not a second training pass
MAX_LOSS_POINTS = 5000  # keeps manifest.json well under the verifier's 1 MiB JSON limit
SAMPLE_NEW_TOKENS = 48


def log(message: str) -> None:
    print(message, flush=True)


T = TypeVar("T")


def split(examples: Sequence[T], s: TrainerSettings) -> tuple[list[T], list[T], list[T]]:
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


def eval_split(n_eval_rows: int, s: TrainerSettings) -> list[int]:
    """The rows of a separate validation file that are evaluated: the first MAX_EVAL_EXAMPLES (in file order,
    so every run on that version evaluates the same rows)."""
    return list(range(min(n_eval_rows, MAX_EVAL_EXAMPLES)))


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


def load_model(s: TrainerSettings, source: str, precision: str, cuda: bool, token: str | None,
               revision: str | None = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if precision == "bf16" else torch.float32, "token": token,
                              "revision": revision}
    if s.load_in_4bit:
        if not cuda:
            raise SettingsError("training.load_in_4bit needs a CUDA GPU (bitsandbytes); this machine has none")
        import bitsandbytes  # noqa: F401  (imported only when asked: a clear error if the image lacks it)
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
        kwargs["device_map"] = {"": 0}
    if cuda and precision == "bf16" and importlib.util.find_spec("flash_attn") is not None:
        # Packed rows then run transformers' varlen kernels; the image does not carry flash-attn (no
        # wheel for its torch and CUDA 13), so there the segment attention over sdpa runs instead.
        kwargs["attn_implementation"] = "flash_attention_2"
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if cuda and not s.load_in_4bit:
        model.to("cuda")  # type: ignore[arg-type]  # transformers types .to() as a wrapped method
    return model


def evaluate(model: Any, examples: Sequence[Tokenized], batch_size: int, pad_id: int, device: Any,
             mode: str) -> float | None:
    import torch

    if not examples:
        return None
    model.eval()
    total, count = 0.0, 0
    # Token-weighted, so the order does not change the result: by length, for the least padding.
    ordered = sorted(examples, key=lambda t: len(t.input_ids))
    with torch.inference_mode():  # no autograd bookkeeping at all, not only no graph
        for i in range(0, len(ordered), batch_size):
            batch = ordered[i: i + batch_size]
            n = trained_tokens(batch)
            if n == 0:
                continue
            total += float(loss_sum(model, collate(batch, pad_id, device, mode), n))
            count += n
    model.train()
    return total / count if count else None


def held_out(model: Any, held: Sequence[Any], s: TrainerSettings, pad_id: int, device: Any, mode: str
             ) -> tuple[float | None, dict[str, float]]:
    """The held-out evaluation: (eval loss, and for dpo its preference_accuracy and reward_margin)."""
    if s.method != "dpo":
        return evaluate(model, held, s.batch_size, pad_id, device, mode), {}
    m = dpo.evaluate(model, held, s.batch_size, pad_id, device, s.dpo_beta, s.dpo_loss)
    if m is None:
        return None, {}
    return m.loss, {"preference_accuracy": round(m.accuracy, 4), "reward_margin": round(m.margin, 4)}


def metric_text(extra: dict[str, float]) -> str:
    return "".join(f" {k}={v:.4f}" for k, v in extra.items())


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


def checkpoint_manifest(base_model: str, step: int, total_steps: int, s: TrainerSettings,
                        batching: str = "", attention: str | None = None) -> dict[str, Any]:
    """What a checkpoint's manifest.json says: enough for the verifier (trainer, base model, files), for
    a reader to tell it from a final adapter (checkpoint_step of steps), and the batching mode its data
    order came from (a resumed run keeps it rather than probing again)."""
    return {"format": 1, "trainer": TRAINER, "base_model": base_model, "kind": s.kind, "checkpoint_step": step,
            "steps": total_steps, "settings": s.as_dict(), "batching": batching, "attention": attention}


@dataclass
class Job:
    """What the environment asks for, checked before torch is imported (bad values: exit 2)."""

    output: Path
    base_model: str
    source: str  # where the weights load from: TENSORANT_BASE_MODEL_PATH, else the hub id
    token: str | None
    s: TrainerSettings
    rows: DatasetRows
    checkpoint_root: Path | None
    resume_from: Path | None
    step_sleep_s: float
    threads: int
    # TENSORANT_EVAL_DATASET_PATH (the run's validation_dataset_version_id): the held-out split is this file's
    # rows, and every row of the training file trains.
    eval_rows: DatasetRows | None = None
    # TENSORANT_BASE_MODEL_REVISION: a Hub model's commit id, pinned at create (None: the hub's main, or a local path)
    revision: str | None = None


def read_job(env: dict[str, str]) -> Job | int:
    """The run's environment checked (settings, dataset rows, a resume folder's match), or an exit code."""
    output, dataset = env.get("TENSORANT_OUTPUT_DIR", ""), env.get("TENSORANT_DATASET_PATH", "")
    base_model = env.get("TENSORANT_BASE_MODEL", "")
    if not (output and dataset and base_model):
        log("trainer: TENSORANT_OUTPUT_DIR, TENSORANT_DATASET_PATH and TENSORANT_BASE_MODEL must be set")
        return 2
    try:
        s, warnings = parse_settings(env.get("TENSORANT_TRAINING"))
        rows = scan_dataset(dataset)  # every row checked, none held: they are read again when encoded
        eval_rows = scan_dataset(env["TENSORANT_EVAL_DATASET_PATH"]) if env.get("TENSORANT_EVAL_DATASET_PATH") else None
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
    threads = env.get("TENSORANT_TORCH_THREADS", "")
    return Job(output=Path(output), base_model=base_model, source=env.get("TENSORANT_BASE_MODEL_PATH") or base_model,
               token=env.get("HF_TOKEN") or None, s=s, rows=rows, checkpoint_root=checkpoint_root,
               resume_from=resume_from, step_sleep_s=float(env.get("TENSORANT_TEST_STEP_SLEEP_S") or 0),
               threads=int(threads) if threads.isdigit() else 0, eval_rows=eval_rows,
               revision=env.get("TENSORANT_BASE_MODEL_REVISION") or None)


def load_base(job: Job, precision: str, cuda: bool) -> tuple[Any, Any] | int:
    """(tokenizer, model), or exit 2 (settings this machine cannot meet) or 3 (no such model)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(job.source, token=job.token, revision=job.revision)
        return tokenizer, load_model(job.s, job.source, precision, cuda, job.token, job.revision)
    except SettingsError as exc:
        log(f"trainer: {exc}")
        return 2
    except (OSError, ValueError, ImportError) as exc:
        # Never echo the token: the exception text carries the model id and the hub's reason only.
        log(f"trainer: could not load base model {job.base_model!r} from {job.source!r}: {load_error(exc, job)}")
        return 3


# The hub's "couldn't connect" errors (huggingface_hub's LocalEntryNotFoundError, an OSError, and the
# transformers wrapper of it) run to ~1,000 characters over several lines.
_UNREACHABLE = ("couldn't connect", "could not connect", "connection", "offline", "max retries", "name resolution")


def load_error(exc: BaseException, job: Job) -> str:
    """Why the base model did not load, on one line a person reads to the end: the log's reason line and
    the run's reason quote it."""
    text = str(exc)
    if job.source == job.base_model and any(word in text.lower() for word in _UNREACHABLE):
        return (f"the Hugging Face hub could not be reached and the model is not in this machine's cache; "
                f"download it once with hub access (`hf download {job.base_model}`) or choose a model this "
                "machine has")
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first if len(first) <= 300 else first[:297] + "..."


def lora_config(s: TrainerSettings, targets: list[str]) -> Any:
    from peft import LoraConfig

    # use_rslora: scaling alpha / sqrt(r) (Kalajdzievski, 2023) keeps the update's size as r grows;
    # use_dora: a trained magnitude per output feature beside the LoRA direction (Liu et al., 2024).
    return LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout, target_modules=targets,
                      bias="none", task_type="CAUSAL_LM", use_rslora=s.use_rslora, use_dora=s.use_dora)


def add_lora(model: Any, s: TrainerSettings, cuda: bool) -> tuple[Any, str, bool, list[str]]:
    """(the peft model, its batching mode, whether attention can run per example, the target modules).
    The mode is choose_batching's; where wants_probe, train() times both and may switch to packed."""
    import torch
    from peft import get_peft_model

    if s.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=s.gradient_checkpointing)
    if s.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    batching = choose_batching(s.batching, model.config.model_type, getattr(model.config, "_attn_implementation", None),
                               cuda=cuda)
    probe = wants_probe(s.batching, model.config.model_type, getattr(model.config, "_attn_implementation", None),
                        cuda=cuda)
    # Packed rows under sdpa: attention per example instead of the row's square under a block mask.
    segments = (batching == "packed" or probe) and use_segment_attention(model)
    targets = ALL_LINEAR if s.target_modules == "all-linear" else ATTENTION
    if model.config.model_type == "phi3":  # Phi-3 fuses q/k/v and gate/up (adapter_format.base_models)
        targets = FUSED_ALL_LINEAR if s.target_modules == "all-linear" else FUSED_ATTENTION
    torch.manual_seed(s.seed)  # the LoRA init draws from here: same seed, same adapter
    model = get_peft_model(model, lora_config(s, targets))
    return model, batching, segments, targets


def make_optimizer(params: list[Any], s: TrainerSettings, cuda: bool) -> Any:
    """The `optimizer` setting with its learning rate and weight decay (AdamW's is decoupled)."""
    import torch

    if s.optimizer == "sgd":
        return torch.optim.SGD(params, lr=s.learning_rate, momentum=0.9, weight_decay=s.weight_decay)
    if s.optimizer == "adamw_8bit":
        if not cuda:
            raise SettingsError("training.optimizer adamw_8bit needs a CUDA GPU (bitsandbytes); this machine has none")
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=s.learning_rate, weight_decay=s.weight_decay)
    return torch.optim.AdamW(params, lr=s.learning_rate, weight_decay=s.weight_decay)


def make_scheduler(optimizer: Any, s: TrainerSettings, total_steps: int) -> tuple[Any, int]:
    """(the `lr_scheduler` setting's schedule, its warmup steps: warmup_steps, else warmup_ratio of the plan)."""
    from transformers import (
        get_constant_schedule_with_warmup,
        get_cosine_schedule_with_warmup,
        get_linear_schedule_with_warmup,
    )

    warmup = min(total_steps, s.warmup_steps if s.warmup_steps is not None else round(s.warmup_ratio * total_steps))
    if s.lr_scheduler == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup), warmup
    if s.lr_scheduler == "linear":
        return get_linear_schedule_with_warmup(optimizer, warmup, total_steps), warmup
    return get_cosine_schedule_with_warmup(optimizer, warmup, total_steps), warmup


@dataclass
class Run:
    """The model being trained and what every step uses."""

    job: Job
    model: Any
    optimizer: Any
    scheduler: Any
    device: Any
    cuda: bool
    pad_id: int
    batching: str
    targets: list[str]
    total_steps: int
    held: Sequence[Tokenized] = ()  # the held-out split: evaluated every eval_every_steps
    neftune: Neftune | None = None
    probe: dict[str, float] | None = None  # real tokens/s per mode, when `auto` was decided by probe_batching
    attention: str | None = None  # the attention implementation training runs under (batches.set_attention)


@dataclass
class Progress:
    """The loop's counters: what a checkpoint saves and a resumed run starts from."""

    losses: list[float] = field(default_factory=list)
    tokens_seen: int = 0  # real tokens
    processed: int = 0  # what the model computed, padding included
    trained: int = 0
    epoch: int = 0
    first_step: int = 1
    eval_before: float | None = None
    steps_done: int = 0
    evals: list[list[float]] = field(default_factory=list)  # [step, eval loss] per evaluation during training
    best: float | None = None  # the lowest eval loss so far, and its step and adapter (keep_best)
    best_step: int = 0
    best_state: dict[str, Any] | None = None
    patience_ref: float | None = None  # what an evaluation must beat by early_stopping_threshold
    bad_evals: int = 0  # evaluations in a row that did not
    stopped_early_at: int | None = None
    preference: dict[str, dict[str, float]] = field(default_factory=dict)  # dpo: "before"/"after" held-out metrics
    # Real tokens per second from the step after WARM_STEPS on (None for shorter runs): without the first
    # steps' kernel loading and, under flex attention, its compiling, which a short run's tokens_per_s holds.
    warm_tokens_per_s: float | None = None

    def saved(self) -> dict[str, Any]:
        """The evaluation counters a checkpoint keeps (the early-stopping state and the best adapter)."""
        return {"evals": self.evals, "best": self.best, "best_step": self.best_step, "best_state": self.best_state,
                "patience_ref": self.patience_ref, "bad_evals": self.bad_evals}


def resume(run: Run, stream: Iterator[tuple[int, list[Tokenized]]], folder: Path) -> Progress:
    """The adapter, optimizer, scheduler, RNG and counters of a step-<k> folder restored, and the
    stream moved past the micro-batches of the k steps already done."""
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(run.model, load_file(folder / WEIGHTS_NAME, device=str(run.device)))
    state = torch.load(folder / STATE_NAME, map_location=run.device, weights_only=True)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"].cpu())  # dropout draws continue where they stopped
    if run.cuda and state.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(state["cuda_rng"].cpu())
    p = Progress(losses=list(state["losses"]), epoch=int(state["epoch"]), eval_before=state["eval_before"],
                 first_step=int(state["step"]) + 1)
    if "evals" in state:
        p.evals, p.best, p.best_step = [list(e) for e in state["evals"]], state["best"], int(state["best_step"])
        p.best_state, p.patience_ref, p.bad_evals = state["best_state"], state["patience_ref"], int(state["bad_evals"])
    p.tokens_seen, p.processed, p.trained = (int(state[k]) for k in ("tokens_seen", "processed", "trained"))
    # The stream is seeded: drawing (and dropping) the micro-batches of the steps already done
    # puts it exactly where the interrupted run was.
    for _ in range((p.first_step - 1) * run.job.s.gradient_accumulation):
        next(stream)
    log(f"trainer: resumed from {folder} at step {p.first_step} of {run.total_steps}")
    return p


def save_checkpoint(run: Run, step: int, p: Progress) -> None:
    import torch

    job, s = run.job, run.job.s
    assert job.checkpoint_root is not None
    snapshot = {"step": step, "seed": s.seed, "optimizer": run.optimizer.state_dict(),
                "scheduler": run.scheduler.state_dict(), "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state() if run.cuda else None, "eval_before": p.eval_before,
                "losses": p.losses, "epoch": p.epoch, "tokens_seen": p.tokens_seen, "processed": p.processed,
                "trained": p.trained, **p.saved()}
    blob = io.BytesIO()
    torch.save(snapshot, blob)
    files = adapter_files(job.checkpoint_root / ".peft", run.model, job.base_model, run.targets,
                          checkpoint_manifest(job.base_model, step, run.total_steps, s, run.batching, run.attention))
    where = write_checkpoint(job.checkpoint_root, step, {**files, STATE_NAME: blob.getvalue()})
    log(f"checkpoint step={step} dir={where}")


def train_loop(run: Run, stream: Iterator[tuple[int, list[Tokenized]]], p: Progress) -> tuple[float, float] | int:
    """Steps first_step..total_steps; (wall seconds, this process's CPU seconds), or exit 1 when the
    loss stops being finite, or EXIT_STOPPED after a SIGTERM."""
    params = [q for q in run.model.parameters() if q.requires_grad]
    run.model.train()
    # SIGTERM (the agent stopping the trainer: a cancel that keeps the disk, a deadline, the machine stopping)
    # ends the loop at the current step's end with a checkpoint of it, so a stop before the first periodic one
    # still leaves something to resume from. Outside the loop SIGTERM ends the process as usual.
    asked: list[int] = []
    try:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: asked.append(signum))
    except ValueError:  # not the main thread (called in-process): no handler to install
        return _steps(run, stream, p, params, asked)
    try:
        return _steps(run, stream, p, params, asked)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _steps(run: Run, stream: Iterator[tuple[int, list[Tokenized]]], p: Progress, params: list[Any],
           asked: list[int]) -> tuple[float, float] | int:
    import torch

    s, model = run.job.s, run.model
    train_started = last_checkpoint = time.monotonic()
    train_cpu_started = time.process_time()
    warm: tuple[float, int] | None = None
    for step in range(p.first_step, run.total_steps + 1):
        if step == p.first_step + WARM_STEPS:
            warm = (time.monotonic(), p.tokens_seen)  # each step ends on float(loss): the GPU is done
        group = [next(stream) for _ in range(s.gradient_accumulation)]
        p.epoch = group[-1][0]
        n_step = 1 if s.method == "dpo" else sum(trained_tokens(b) for _, b in group) or 1
        step_loss = 0.0
        if s.method == "dpo":
            step_loss = _dpo_step(run, group, p)
        for _, batch in group if s.method != "dpo" else ():
            n = trained_tokens(batch)
            if n == 0:
                continue
            inputs = collate(batch, run.pad_id, run.device, run.batching)
            if run.neftune is not None:
                run.neftune.set_inputs(inputs)
            # Token-weighted over the whole accumulated step, not a mean of micro-batch means.
            loss = loss_sum(model, inputs, n) / n_step
            loss.backward()
            step_loss += float(loss.detach())
            p.tokens_seen += sum(len(t.input_ids) for t in batch)
            p.processed += inputs["input_ids"].numel()
            p.trained += n
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        if not math.isfinite(step_loss):
            log(f"trainer: loss became {step_loss} at step {step}; lower learning_rate and train again")
            return 1
        p.losses.append(step_loss)
        log(f"progress={step / run.total_steps:.4f} step={step} loss={step_loss:.4f} "
            f"lr={run.scheduler.get_last_lr()[0]:.3e} epoch={p.epoch}")
        p.steps_done = step
        if run.job.step_sleep_s:
            time.sleep(run.job.step_sleep_s)
        evaluating = bool(s.eval_every_steps and run.held) and (step % (s.eval_every_steps or 1) == 0
                                                              or step == run.total_steps)
        if evaluating and not evaluate_during(run, step, p):
            break  # early stopping: the adapter is written as after the last step
        due = step % s.checkpoint_every_steps == 0 or time.monotonic() - last_checkpoint >= s.checkpoint_every_s
        if run.job.checkpoint_root is not None and step < run.total_steps and (due or asked):
            # The last step needs none: the final adapter is written right after it.
            save_checkpoint(run, step, p)
            last_checkpoint = time.monotonic()
        if asked and step < run.total_steps:
            log(f"trainer: stopped (SIGTERM) at step {step} of {run.total_steps}"
                + ("; its checkpoint is saved" if run.job.checkpoint_root is not None else ""))
            return EXIT_STOPPED
    if warm is not None and time.monotonic() > warm[0]:
        p.warm_tokens_per_s = round((p.tokens_seen - warm[1]) / (time.monotonic() - warm[0]), 1)
    return time.monotonic() - train_started, time.process_time() - train_cpu_started


def _dpo_step(run: Run, group: list[tuple[int, list[Any]]], p: Progress) -> float:
    """One accumulated step of DPO: the mean pair loss over the step's pairs; tokens are both sequences'."""
    s = run.job.s
    pairs = sum(len(b) for _, b in group) or 1
    total = 0.0
    for _, batch in group:
        losses, _, _ = dpo.pair_losses(run.model, batch, run.pad_id, run.device, s.dpo_beta, s.dpo_loss)
        loss = losses.sum() / pairs
        loss.backward()
        total += float(loss.detach())
        p.tokens_seen += sum(pair.tokens for pair in batch)
        width = max(max(len(q.chosen.input_ids), len(q.rejected.input_ids)) for q in batch)
        p.processed += 2 * len(batch) * width
        p.trained += sum(q.chosen.trained_tokens + q.rejected.trained_tokens for q in batch)
    return total


def trainable_state(model: Any) -> dict[str, Any]:
    """A copy, on the CPU, of the weights being trained (the LoRA matrices, DoRA's magnitudes)."""
    return {name: q.detach().to("cpu", copy=True) for name, q in model.named_parameters() if q.requires_grad}


def evaluate_during(run: Run, step: int, p: Progress) -> bool:
    """One evaluation during training: logged (`eval step=<n> eval_loss=<x>`, the run view's eval curve),
    the best adapter copied (keep_best), and False when early stopping ends the training here."""
    s = run.job.s
    loss, extra = held_out(run.model, run.held, s, run.pad_id, run.device, run.batching)
    if loss is None:
        return True
    p.evals.append([step, round(loss, 5)])
    if extra:
        p.preference["after"] = extra
    log(f"eval step={step} eval_loss={loss:.4f}{metric_text(extra)}")
    if p.best is None or loss < p.best:
        p.best, p.best_step = loss, step
        if s.keep_best:
            p.best_state = trainable_state(run.model)
    if p.patience_ref is None or loss < p.patience_ref - s.early_stopping_threshold:
        p.patience_ref, p.bad_evals = loss, 0
        return True
    p.bad_evals += 1
    if s.early_stopping_patience is not None and p.bad_evals >= s.early_stopping_patience:
        p.stopped_early_at = step
        log(f"trainer: early stopping at step {step} of {run.total_steps}: {p.bad_evals} evaluation(s) in a row did "
            f"not improve eval_loss {p.patience_ref:.4f} by more than {s.early_stopping_threshold}")
        return False
    return True


def keep_best(run: Run, p: Progress) -> float | None:
    """After training with evaluations: the best evaluation's adapter put back when the last one is
    worse (keep_best); returns the eval loss of the adapter that will be written."""
    if not p.evals:
        return None
    last_step, last = p.evals[-1]
    if run.job.s.keep_best and p.best_state is not None and p.best is not None and p.best < last:
        import torch

        with torch.no_grad():
            for name, q in run.model.named_parameters():
                if name in p.best_state:
                    q.copy_(p.best_state[name].to(q.device))
        log(f"trainer: kept the adapter of step {p.best_step} (eval_loss {p.best:.4f}), the best evaluation; "
            f"the last, at step {int(last_step)}, was {last:.4f}")
        return p.best
    return None if int(last_step) != p.steps_done else last


def sample_outputs(run: Run, tokenizer: Any, rows: list[Example]) -> list[dict[str, str]]:
    """The base model's and the adapter's greedy answers to each sample prompt, logged and returned."""
    model = run.model
    samples = []
    if run.attention == FLEX:
        # Decoding under flex attention would compile for each new length: sdpa generates the same tokens.
        set_attention(model, SEGMENTS)
    model.eval()
    model.config.use_cache = True
    for ex in rows:
        prompt, expected = sample_prompt(tokenizer, ex)
        chat = ex.messages is not None
        tuned = generate(model, tokenizer, prompt, run.device, chat=chat)
        with model.disable_adapter():
            base = generate(model, tokenizer, prompt, run.device, chat=chat)
        samples.append({"prompt": prompt[-2000:], "expected": expected[:2000], "base": base, "adapter": tuned})
        log(f"sample prompt: {prompt!r}")
        log(f"sample base model: {base!r}")
        log(f"sample with adapter: {tuned!r}")
        log(f"sample dataset answer: {expected!r}")
    return samples


def build_manifest(run: Run, p: Progress, splits: tuple[Encoded, Encoded], *, eval_after: float | None,
                   trainable: int, timing: tuple[float, float], started: float, precision: str,
                   samples: list[dict[str, str]]) -> dict[str, Any]:
    """manifest.json of the finished run (adapter_files adds the files' hashes)."""
    import torch

    job, s, (encoded, held), (train_seconds, train_cpu_seconds) = run.job, run.job.s, splits, timing
    every = max(1, math.ceil(len(p.losses) / MAX_LOSS_POINTS))
    manifest: dict[str, Any] = {
        "format": 1,
        "trainer": TRAINER,
        "base_model": job.base_model,
        "rows": len(job.rows),
        "kind": s.kind,
        "train_examples": len(encoded.examples),
        "eval_examples": len(held.examples),
        "eval_source": "validation_dataset" if job.eval_rows is not None else "held_out",
        "steps": run.total_steps,
        "epochs_seen": p.epoch + 1,
        "tokens": p.tokens_seen,
        "trained_tokens": p.trained,
        "loss": [round(x, 5) for x in p.losses[::every]],
        "loss_every": every,
        "eval_loss_before": p.eval_before,
        "eval_loss": eval_after,
        # Per split: truncated/dropped count training rows, eval_truncated/eval_dropped held-out rows.
        "truncated": encoded.truncated,
        "dropped": encoded.dropped,
        "eval_truncated": held.truncated,
        "eval_dropped": held.dropped,
        "row_counts": "truncated and dropped count training rows; eval_truncated and eval_dropped held-out rows",
        "batching": run.batching,
        "attention": run.attention,
        "processed_tokens": p.processed,
        "padding_fraction": round(1 - p.tokens_seen / p.processed, 4) if p.processed else 0.0,
        "trainable_params": trainable,
        "train_seconds": round(train_seconds, 3),
        # This process's CPU time in the loop: unlike the wall time, not stretched by other work on the machine.
        "train_cpu_seconds": round(train_cpu_seconds, 3),
        "duration_s": round(time.monotonic() - started, 3),
        "tokens_per_s": round(p.tokens_seen / train_seconds, 1) if train_seconds > 0 else None,
        "processed_tokens_per_s": round(p.processed / train_seconds, 1) if train_seconds > 0 else None,
        "tokens_per_s_warm": p.warm_tokens_per_s,
        "device": torch.cuda.get_device_name(0) if run.cuda else f"cpu ({platform.machine()})",
        "precision": precision,
        "peak_gpu_memory_bytes": int(torch.cuda.max_memory_allocated()) if run.cuda else None,
        "versions": versions(),
        "settings": s.as_dict(),
        "target_modules": run.targets,
        "samples": samples,
    }
    if s.method == "dpo":
        manifest["preference"] = p.preference  # held-out preference_accuracy and reward_margin, before/after
    manifest.update(steps_done=p.steps_done, eval_curve=p.evals, best_step=p.best_step if p.evals else None,
                    stopped_early_at=p.stopped_early_at, batching_probe=run.probe)
    if job.resume_from is not None:
        manifest["resumed_from_step"] = p.first_step - 1
    return manifest


def quiet_library_warnings() -> None:
    """No FutureWarning in a run's log: transformers' and peft's deprecation notices (two in every run,
    each with its source path) are for whoever upgrades the trainer's pins, not for the user reading the
    log; this code raises none. Every other warning still shows."""
    warnings.filterwarnings("ignore", category=FutureWarning)


def _encode_pairs(tokenizer: Any, job: Job, train_rows: Sequence[int], eval_rows: Sequence[int]
                  ) -> tuple[dpo.EncodedPairs, dpo.EncodedPairs]:
    s = job.s
    encoded = dpo.encode_pairs(tokenizer, job.rows.examples(list(train_rows)), s.max_seq_len)
    source = job.eval_rows if job.eval_rows is not None else job.rows
    held = dpo.encode_pairs(tokenizer, source.examples(list(eval_rows)), s.max_seq_len)
    return encoded, held


def train(env: dict[str, str]) -> int:
    quiet_library_warnings()
    started = time.monotonic()
    job = read_job(env)
    if isinstance(job, int):
        return job
    cuda = torch_ready(job, env)
    if cuda is None:
        return EXIT_GPU
    code = train_adapter(env, job, cuda, started)
    if code == 0 and job.s.merged:
        # The training model and its optimizer state were freed with train_adapter's frame: the merge loads the base
        # model again.
        merge.free_memory(cuda)
        # On the GPU only when the run trained there unquantized: it held at least these weights then.
        merge.merge_into_output(job.source, job.output, job.base_model,
                                device="cuda" if cuda and not job.s.load_in_4bit else "cpu", token=job.token)
    return code


def torch_ready(job: Job, env: dict[str, str]) -> bool | None:
    """Torch set up for the job (threads, seeds): whether it trains on a GPU; None when the GPU's driver cannot."""
    import torch

    if job.threads > 0:
        torch.set_num_threads(job.threads)
    problem = gpu_problem(env.get("TENSORANT_NVIDIA_DRIVER_FILE") or "/proc/driver/nvidia/version")
    if problem is not None:
        log(f"trainer: {problem}")
        return None
    torch.manual_seed(job.s.seed)
    random.seed(job.s.seed)
    return bool(torch.cuda.is_available())


def train_adapter(env: dict[str, str], job: Job, cuda: bool, started: float) -> int:
    """Load, encode, train and write the adapter with its manifest: the trainer's exit code."""
    import torch

    s = job.s
    device = torch.device("cuda" if cuda else "cpu")
    if s.packed_attention == "flex" and not flex_trainable(cuda):
        log("trainer: training.packed_attention flex needs a CUDA GPU with Triton (torch has no flex attention "
            "backward on the CPU); use auto or segments")
        return 2
    precision = choose_precision(s, cuda)
    train_rows, eval_rows, sample_rows = row_split(job)
    log_job(job, device, precision, len(train_rows), len(eval_rows))
    loaded = load_tokenizer_and_model(job, precision, cuda)
    if isinstance(loaded, int):
        return loaded
    tokenizer, model, pad_id = loaded
    splits = encode(tokenizer, job, train_rows, eval_rows)
    if isinstance(splits, int):
        return splits
    encoded, held = splits
    run = prepare_run(job, model, encoded, held, pad_id, device, cuda)
    if isinstance(run, int):
        return run
    trainable = trainable_count(run.model)
    stream = batch_stream(encoded.examples, s.batch_size, s.seed, grouped=run.batching == "grouped")
    progress = resume(run, stream, job.resume_from) if job.resume_from is not None else first_progress(run)
    timing = train_loop(run, stream, progress)
    if isinstance(timing, int):
        return timing
    manifest = partial(build_manifest, run, progress, (encoded, held), trainable=trainable,
                       timing=timing, started=started, precision=precision)
    eval_after = write_results(run, progress, manifest, tokenizer, sample_rows)
    log(f"trainer: wrote {CONFIG_NAME}, {WEIGHTS_NAME}, {MANIFEST_NAME} to {job.output} (loss "
        f"{progress.losses[0]:.4f} -> {progress.losses[-1]:.4f}, {progress.tokens_seen} tokens in {timing[0]:.1f}s)")
    if env.get("MLFLOW_TRACKING_URI") or env.get("WANDB_API_KEY"):
        track(env, job, progress, eval_after, timing[0])
    return 0


def row_split(job: Job) -> tuple[list[int], list[int], list[Example]]:
    """The training rows, the held-out rows (indices) and the rows sampled after training. A seeded shuffle depends
    only on the length, so these are the rows split() picked from parsed rows."""
    s, rows = job.s, job.rows
    if job.eval_rows is not None:
        train_rows, _, _ = split(range(len(rows)), replace(s, eval_fraction=0.0))
        eval_rows = eval_split(len(job.eval_rows), s)
        return list(train_rows), eval_rows, job.eval_rows.examples(eval_rows[: s.sample_prompts])
    train_rows, eval_rows, sample_at = split(range(len(rows)), s)
    return list(train_rows), list(eval_rows), rows.examples(sample_at)


def log_job(job: Job, device: Any, precision: str, n_train: int, n_eval: int) -> None:
    s, rows = job.s, job.rows
    log(f"trainer: lora kind={s.kind} base_model={job.base_model} rows={len(rows)} train={n_train} "
        f"eval={n_eval} device={device.type} precision={precision} 4bit={s.load_in_4bit}")
    if s.kind == "trial" or s.max_examples is not None:
        log(f"trainer: trial run: training on a sample of {n_train} of the dataset's {len(rows)} rows")


def load_tokenizer_and_model(job: Job, precision: str, cuda: bool) -> tuple[Any, Any, int] | int:
    """The tokenizer with the chat template applied, the base model and the padding token's id; or the exit code."""
    loaded = load_base(job, precision, cuda)
    if isinstance(loaded, int):
        return loaded
    tokenizer, model = loaded
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    try:
        apply_template(tokenizer, job.s.chat_template)
    except TemplateError as exc:
        log(f"trainer: {exc}")
        return 2
    return tokenizer, model, pad_id


def encode(tokenizer: Any, job: Job, train_rows: Sequence[int], eval_rows: Sequence[int]) -> tuple[Any, Any] | int:
    """The training and held-out splits encoded (Encoded for sft, dpo.EncodedPairs for dpo: the loop, checkpoints
    and manifest take either); or the exit code when the dataset does not fit the method or leaves nothing to learn."""
    s, rows = job.s, job.rows
    pairs = rows.examples([0])[0].chosen is not None  # the API keeps a dataset version all pairs or all examples
    if pairs != (s.method == "dpo"):
        log("trainer: " + ("training.method is dpo but the dataset holds training examples, not preference pairs"
                           if s.method == "dpo" else "the dataset holds preference pairs; set training.method to dpo"))
        return 2
    splits = encode_method(tokenizer, job, train_rows, eval_rows)
    if isinstance(splits, int):
        return splits
    encoded, held = splits
    if s.method == "dpo" and (s.train_on_inputs or s.neftune_alpha is not None):
        log("trainer: train_on_inputs and neftune_alpha are SFT settings; a DPO run scores the answers only, "
            "without noise, and ignores them")
    elif s.train_on_inputs:
        # Training rows only: the held-out loss stays the assistant's, comparable across runs.
        encoded = with_inputs(encoded)
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
    return encoded, held


def encode_method(tokenizer: Any, job: Job, train_rows: Sequence[int], eval_rows: Sequence[int]
                  ) -> tuple[Any, Any] | int:
    """The splits encoded as the method reads them: preference pairs for dpo, examples for sft."""
    s, rows = job.s, job.rows
    if s.method == "dpo":
        try:
            return _encode_pairs(tokenizer, job, train_rows, eval_rows)
        except (DatasetError, ValueError) as exc:
            log(f"trainer: {exc} (a dataset for method dpo is all preference pairs)")
            return 2
    if job.eval_rows is not None:
        [encoded] = encode_splits(tokenizer, rows, [train_rows], s.max_seq_len)
        [held] = encode_splits(tokenizer, job.eval_rows, [eval_rows], s.max_seq_len)
        log(f"trainer: evaluating on the validation dataset's {len(eval_rows)} rows (of {len(job.eval_rows)})")
        return encoded, held
    encoded, held = encode_splits(tokenizer, rows, [train_rows, eval_rows], s.max_seq_len)
    return encoded, held


def trainable_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def prepare_run(job: Job, model: Any, encoded: Any, held: Any, pad_id: int, device: Any, cuda: bool) -> Run | int:
    """The model with its LoRA layers (and NEFTune's noise), its batching, optimizer and schedule; or the exit code."""
    s = job.s
    choices = candidates(s.batching, s.packed_attention, model.config.model_type,
                         getattr(model.config, "_attn_implementation", None), cuda=cuda)
    model, _, _, targets = add_lora(model, s, cuda)
    neftune = None
    if s.neftune_alpha is not None and s.method != "dpo":
        neftune = Neftune(s.neftune_alpha)
        neftune.attach(model)
    batching, attention, segments, probe = settle_batching(job, model, encoded, choices, pad_id, device, neftune)
    total_steps = plan_steps(len(encoded.examples), s)
    try:
        optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad], s, cuda)
    except SettingsError as exc:
        log(f"trainer: {exc}")
        return 2
    scheduler, warmup = make_scheduler(optimizer, s, total_steps)
    run = Run(job=job, model=model, optimizer=optimizer, scheduler=scheduler, device=device, cuda=cuda, pad_id=pad_id,
              batching=batching, targets=targets, total_steps=total_steps, held=held.examples, neftune=neftune,
              probe=probe, attention=attention)
    log_plan(run, warmup, segments)
    return run


def settle_batching(job: Job, model: Any, encoded: Any, choices: list[tuple[str, str | None]], pad_id: int,
                    device: Any, neftune: Neftune | None) -> tuple[str, str | None, bool, dict[str, float] | None]:
    """The batching and attention training runs under (set on the model): the first of `choices`, kept from the
    interrupted run on a resume, or decided by a probe on a GPU; whether packed attention is per example; and the
    probe's figures when one ran."""
    s = job.s
    probe = None
    batching, attention = choices[0]
    resumed = (json.loads((job.resume_from / MANIFEST_NAME).read_text()) if job.resume_from is not None else {})
    if resumed.get("batching") in ("grouped", "packed") and s.batching == "auto":
        # The interrupted run's data order, whatever a probe would say now; its attention where it is one of ours.
        batching = resumed["batching"]
        attention = next((a for m, a in choices if m == batching and a == resumed.get("attention")),
                         next((a for m, a in choices if m == batching), attention))
    elif s.method != "dpo" and len(choices) > 1:
        (batching, attention), probe = probe_batching(model, encoded.examples, s.batch_size, s.seed, pad_id, device,
                                                      neftune, choices)
        log("trainer: batching probe (real tokens/s): " + ", ".join(f"{k} {v}" for k, v in probe.items())
            + f" -> {choice_name(batching, attention)}")
    if s.method == "dpo":
        # A pair's two sequences share one padded forward (the reference's too): no packing, no probe.
        return "padded", getattr(model.config, "_attn_implementation", None), False, None
    set_attention(model, attention)
    return batching, attention, attention == SEGMENTS, probe


def log_plan(run: Run, warmup: int, segments: bool) -> None:
    s = run.job.s
    log(f"trainer: steps={run.total_steps} warmup={warmup} batch={s.batch_size}x{s.gradient_accumulation} "
        f"lora r={s.lora_r} alpha={s.lora_alpha} targets={','.join(run.targets)} "
        f"trainable_params={trainable_count(run.model)} batching={run.batching}"
        f"{' (attention per example)' if segments and run.batching == 'packed' else ''}"
        f"{' (flex attention, a document mask)' if run.attention == FLEX and run.batching == 'packed' else ''} "
        f"optimizer={s.optimizer} lr_scheduler={s.lr_scheduler}"
        + (" dora" if s.use_dora else "") + (" rslora" if s.use_rslora else "")
        + (f" neftune_alpha={s.neftune_alpha}" if run.neftune else ""))


def first_progress(run: Run) -> Progress:
    """A fresh run's progress, with the held-out loss before training."""
    before, extra = held_out(run.model, run.held, run.job.s, run.pad_id, run.device, run.batching)
    progress = Progress(eval_before=before, preference={"before": extra} if extra else {})
    if progress.eval_before is not None:
        log(f"trainer: eval_loss before training = {progress.eval_before:.4f}{metric_text(extra)}")
    return progress


def write_results(run: Run, progress: Progress, manifest: Callable[..., dict[str, Any]], tokenizer: Any,
                  sample_rows: list[Example]) -> float | None:
    """The trained adapter written, then its final eval and samples, then written again with them: the held-out loss
    after training."""
    job = run.job
    eval_after = keep_best(run, progress)
    # The final adapter first, before the final eval and the samples (minutes on a CPU): a run whose runtime limit
    # passes during those still has its finished training's adapter, which the agent uploads at this line
    # (machine/agent/trainer.py). Written again below with the eval and samples: the same weights, so the
    # files stay consistent whichever of the two writes a reader sees.
    job.output.mkdir(parents=True, exist_ok=True)
    write_outputs(job.output, run.model, job.base_model, run.targets, manifest(eval_after=eval_after, samples=[]))
    log(f"{FINAL_WRITTEN} ({progress.steps_done} of {run.total_steps} steps); the final eval and samples follow")
    extra = progress.preference.get("after", {})
    if eval_after is None:
        eval_after, extra = held_out(run.model, run.held, job.s, run.pad_id, run.device, run.batching)
        if extra:
            progress.preference["after"] = extra
    if eval_after is not None:
        # The metrics on a line of their own: the "after training = x" line is parsed up to its end.
        log(f"trainer: eval_loss after training = {eval_after:.4f}")
        if extra:
            log(f"trainer: preference after training:{metric_text(extra)}")
    samples = sample_outputs(run, tokenizer, sample_rows)
    job.output.mkdir(parents=True, exist_ok=True)
    write_outputs(job.output, run.model, job.base_model, run.targets, manifest(eval_after=eval_after, samples=samples))
    return eval_after


def track(env: dict[str, str], job: Job, progress: Progress, eval_after: float | None, seconds: float) -> None:
    """The run reported to the org's MLflow or W&B (machine/trainer/tracking.py)."""
    tracking.report(env, log, run_name=env.get("TENSORANT_RUN_ID") or job.base_model, params=job.s.as_dict(),
                    losses=progress.losses, evals=[(int(e[0]), float(e[1])) for e in progress.evals],
                    summary={**progress.preference.get("after", {}),
                             "eval_loss_before": progress.eval_before, "eval_loss": eval_after,
                             "tokens": float(progress.tokens_seen), "train_seconds": seconds},
                    adapter_sha256=hashlib.sha256((job.output / WEIGHTS_NAME).read_bytes()).hexdigest())


def main() -> int:
    return train(dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
