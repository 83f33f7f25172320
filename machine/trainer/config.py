"""The trainer's settings: TENSORANT_TRAINING parsed and checked (no torch needed).

Field names, defaults and ranges are the cross-team contract (the control plane validates the
same names at POST /api/runs). The trainer checks them again because it can also be run by hand;
an unknown field is reported and ignored so an older trainer image accepts a newer control plane.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from machine.trainer.templates import PRESETS


class SettingsError(ValueError):
    """TENSORANT_TRAINING is malformed; the message names the field and the allowed values."""


@dataclass(frozen=True)
class TrainerSettings:
    """TENSORANT_TRAINING as the trainer reads it on the machine (the API's side of the contract is
    shared.models.TrainingSettings, which this checks again)."""

    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: str = "attention"
    learning_rate: float = 2e-4
    epochs: float = 1.0
    max_steps: int | None = None
    batch_size: int = 4
    gradient_accumulation: int = 1
    warmup_ratio: float = 0.03
    max_seq_len: int = 1024
    precision: str = "auto"
    load_in_4bit: bool = False
    gradient_checkpointing: bool = True
    seed: int = 42
    eval_fraction: float = 0.1
    sample_prompts: int = 3
    max_examples: int | None = None
    kind: str = "full"
    # auto | padded | grouped | packed (machine.trainer.batches); auto: packed on the CPU and under flash
    # attention, else grouped
    batching: str = "auto"
    # auto | segments | flex: how a packed row keeps attention within each example (machine.trainer.batches);
    # auto: segments, and on a GPU flex attention too, timed against it on the run's rows
    packed_attention: str = "auto"
    # A checkpoint (adapter + optimizer state) every this many steps and every this many seconds,
    # whichever comes first, when the agent gives TENSORANT_CHECKPOINT_DIR: a run stopped at its
    # time limit keeps at most this much of its work unsaved.
    checkpoint_every_steps: int = 50
    checkpoint_every_s: int = 600
    keep_checkpoints: int = 3  # the agent's: how many checkpoint adapters it keeps in storage
    # Evaluation on the held-out split every this many steps (None: before and after training only);
    # with it, the adapter of the best evaluation is the one written (keep_best), and training stops
    # after early_stopping_patience evaluations that did not improve the best by more than
    # early_stopping_threshold (None: never stops early).
    eval_every_steps: int | None = None
    early_stopping_patience: int | None = None
    early_stopping_threshold: float = 0.0
    keep_best: bool = True
    # None: the tokenizer's own chat template (FALLBACK_TEMPLATE when it has none); a name of
    # machine.trainer.templates.PRESETS; or a Jinja chat template's text.
    chat_template: str | None = None
    train_on_inputs: bool = False  # loss on every token of a chat row, not only the assistant's
    use_dora: bool = False  # weight-decomposed LoRA (peft use_dora): a magnitude vector per adapted module
    use_rslora: bool = False  # rank-stabilised scaling alpha / sqrt(r) instead of alpha / r
    neftune_alpha: float | None = None  # NEFTune: uniform noise alpha / sqrt(len * dim) on the embeddings
    lr_scheduler: str = "cosine"  # cosine | linear | constant (each after the warmup)
    warmup_steps: int | None = None  # overrides warmup_ratio
    optimizer: str = "adamw"  # adamw | adamw_8bit (bitsandbytes, CUDA) | sgd (momentum 0.9)
    weight_decay: float = 0.0  # decoupled (AdamW's); for sgd, L2
    # Also write the adapter merged into the base model's weights (machine.trainer.merge): a second artifact.
    merged: bool = False
    # sft | dpo (preference pairs; the reference is the base with the adapter disabled)
    method: str = "sft"
    dpo_beta: float = 0.1
    dpo_loss: str = "sigmoid"  # sigmoid | ipo

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# name -> (kind, low, high, low_open): ranges as in the contract; None = unbounded on that side.
_INT = {"lora_r": (1, 256), "lora_alpha": (1, 1024), "max_steps": (1, 100000), "batch_size": (1, 256),
        "gradient_accumulation": (1, 256), "max_seq_len": (16, 32768), "seed": (0, 2**32 - 1),
        "sample_prompts": (0, 10), "max_examples": (1, 10_000_000),
        "checkpoint_every_steps": (1, 100000), "checkpoint_every_s": (30, 7 * 24 * 3600),
        "keep_checkpoints": (1, 10),
        "eval_every_steps": (1, 100000), "early_stopping_patience": (1, 1000), "warmup_steps": (0, 100000)}
_FLOAT = {"lora_dropout": (0.0, 0.5, False), "learning_rate": (0.0, 0.01, True), "epochs": (0.0, 20.0, True),
          "warmup_ratio": (0.0, 0.5, False), "eval_fraction": (0.0, 0.5, False),
          "early_stopping_threshold": (0.0, 10.0, False), "neftune_alpha": (0.0, 50.0, True),
          "weight_decay": (0.0, 1.0, False), "dpo_beta": (0.0, 10.0, True)}
_CHOICES = {"target_modules": ("attention", "all-linear"), "precision": ("auto", "bf16", "fp32"),
            "kind": ("trial", "full"), "batching": ("auto", "padded", "grouped", "packed"),
            "packed_attention": ("auto", "segments", "flex"),
            "lr_scheduler": ("cosine", "linear", "constant"), "optimizer": ("adamw", "adamw_8bit", "sgd"),
            "method": ("sft", "dpo"), "dpo_loss": ("sigmoid", "ipo")}
_BOOL = ("load_in_4bit", "gradient_checkpointing", "keep_best", "train_on_inputs", "use_dora", "use_rslora",
         "merged")
_NULLABLE = ("max_steps", "max_examples", "eval_every_steps", "early_stopping_patience", "chat_template",
             "neftune_alpha", "warmup_steps")
MAX_CHAT_TEMPLATE = 16384  # characters: a template is a few kB; the settings travel in an env variable


def parse_settings(raw: str | None) -> tuple[TrainerSettings, list[str]]:
    """(settings, warnings) from the TENSORANT_TRAINING JSON text; missing or empty = defaults."""
    if not raw or not raw.strip():
        return TrainerSettings(), []
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"TENSORANT_TRAINING is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise SettingsError("TENSORANT_TRAINING must be a JSON object of training settings")
    known = {f.name for f in fields(TrainerSettings)}
    warnings = [f"TENSORANT_TRAINING field {k!r} is not known to this trainer and was ignored"
                for k in sorted(data) if k not in known]
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name not in known:
            continue
        if value is None and name in _NULLABLE:
            values[name] = None
        elif name in _INT:
            values[name] = _int(name, value, *_INT[name])
        elif name in _FLOAT:
            values[name] = _float(name, value, *_FLOAT[name])
        elif name in _CHOICES:
            if value not in _CHOICES[name]:
                raise SettingsError(f"training.{name} must be one of {', '.join(_CHOICES[name])}, not {value!r}")
            values[name] = value
        elif name in _BOOL:
            if not isinstance(value, bool):
                raise SettingsError(f"training.{name} must be true or false, not {value!r}")
            values[name] = value
        elif name == "chat_template":
            values[name] = _template(value)
    settings = TrainerSettings(**values)
    if settings.early_stopping_patience is not None and settings.eval_every_steps is None:
        raise SettingsError("training.early_stopping_patience needs training.eval_every_steps: early stopping "
                            "decides on the evaluations made during training")
    return settings, warnings


def _template(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"training.chat_template must be a template name ({', '.join(PRESETS)}) or a Jinja "
                            f"chat template's text, not {value!r}")
    if len(value) > MAX_CHAT_TEMPLATE:
        raise SettingsError(f"training.chat_template is {len(value)} characters; at most {MAX_CHAT_TEMPLATE}")
    if value not in PRESETS and "messages" not in value:
        raise SettingsError(f"training.chat_template {value[:40]!r} is neither a known template name "
                            f"({', '.join(PRESETS)}) nor a Jinja chat template (which loops over `messages`)")
    return value


def _int(name: str, value: Any, low: int, high: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"training.{name} must be a whole number, not {value!r}")
    if value < low or (high is not None and value > high):
        raise SettingsError(f"training.{name} must be between {low} and {high if high is not None else 'any'}, "
                            f"not {value}")
    return value


def _float(name: str, value: Any, low: float, high: float, low_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SettingsError(f"training.{name} must be a number, not {value!r}")
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise SettingsError(f"training.{name} must be in {bracket}{low}, {high}], not {value}")
    return float(value)
