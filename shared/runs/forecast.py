"""A run's forecast before launch: how long it will train, how long its machine takes to start, and
what that costs at the offer's price.

Made at create and at a draft's edit (shared/runs/admission.py, the one path for both), stored on the run
and shown in its view and by `tensorant runs create|get`. It sets the default runtime limit
(runtime_limit_for) and warns when the run's limits do not cover it (warnings). Every figure below is
an assumption, written down so it can be argued with; `basis` repeats the ones a run used.

Checked: when a run's final adapter is verified, check() compares the forecast with the figures the
trainer wrote in its manifest (train_seconds, tokens) and the run records the error (forecast_check,
in its view and events): the table below is an assumption, and each finished run says how far off it was.

Measured throughput first: when a run of the organization with the same base model on the same
provider and GPU, with the same precision, 4-bit and gradient checkpointing settings, had its final
adapter verified with a check that measured at least MIN_MEASURED_S of training, the last such
measurement replaces the table below (basis names the run). It is kept in an index, one row per
(org, provider, model, GPU, those settings) in the `throughput` table (record_measured, written by
the verify step; measured_for, one point read at create and edit), never looked for in the org's
history. The trainer's figures are the machine's word: check() takes them only within
MIN_TOKENS_PER_S..MAX_TOKENS_PER_S and MAX_TRAIN_S (the verify step says why when it does not), and a
measured throughput that is not a positive finite number is never used. On the local provider this is what makes the default
runtime limit follow what the trainer measured on this host, instead of an assumed CPU.

Tokens: estimated from bytes, never measured here (the function app installs no tokenizer and has no
hub; the trainer measures them, and the check above says how far the estimate was)
  tokens per example = min(dataset bytes / rows / 4, max_seq_len). 4 bytes per token is the usual
  figure for English text with BPE vocabularies of 32k-150k; the JSON syntax of a row
  ({"messages": [{"role": ...) stands in for the chat template's tokens. Code, numbers and
  non-English text give more tokens per byte, so the forecast is then short: the default runtime
  limit's margin is for that.
  examples trained on = steps x batch_size x gradient_accumulation (the trainer's stream cycles
  through the rows, so max_steps may go past one epoch); tokens = that x tokens per example.

Steps: as machine/trainer/lora.py plans them (split, plan_steps; tests/test_forecast.py checks they agree)
  rows used = min(rows, max_examples) (a trial's bound is already in max_examples: runs.resolve_training);
  held out for eval from MIN_EVAL_ROWS rows up: min(MAX_EVAL_ROWS, max(1, int(rows used x eval_fraction)));
  steps = max_steps, else ceil(epochs x ceil(ceil(training rows / batch_size) / gradient_accumulation)).

Throughput: tokens per second of LoRA SFT = peak FLOPS x MFU / FLOPs per token
  FLOPs per token, N = the parameters a token is multiplied by (all but the input embeddings, which
  are a lookup): forward 2N, backward to the activations 2N; LoRA computes no gradient of the frozen
  weights, the other 2N of full fine-tuning's 6N (so LoRA costs ~2/3 of it). Gradient checkpointing
  (the default) runs the forward again during backward: +2N. So 6N with checkpointing, 4N without.
  Left out (the default limit's margin covers them): attention's token-by-token products (about
  4 x layers x seq x q_dim per token: ~10 % for a 0.5B model at 1024 tokens, less for 7B), LoRA's own
  matmuls (~1 %), lm_head recomputed by the chunked loss, padding (grouped batching keeps it near
  5 %), the eval passes and the sample generations.
  Peak FLOPS: the vendor's dense (no sparsity) bf16 tensor-core figure; precision fp32 uses the
  non-tensor fp32 figure (the trainer leaves TF32 off). MFU (model FLOPs utilisation): A100, H100,
  H200 40 %; A10, L40S, workstation and consumer cards 35 %; L4 30 % (a 72 W card that throttles
  under sustained load); the ranges commonly reported for LoRA SFT of 1B+ models with transformers +
  PEFT. On a GPU, models under 1B parameters get half that (SMALL_MODEL_MFU): their matmuls are small,
  and the per-layer work that is not a matmul (norms, activations, kernel launches) weighs more.
  4-bit (QLoRA) dequantizes each weight in every matmul: throughput x QLORA_SPEED (0.72: 39 % longer
  than LoRA on an A100, S. Raschka, "Practical Tips for Finetuning LLMs Using LoRA", 2023).
  A GPU not in the table gets an entry-level Ampere card's figures, so its forecast errs long.
  Local (the CPU of the control plane's host, fp32): an effective 10 GFLOPS (CpuTraining.gflops, declared
  by the provider). No tokens/s
  is recorded for it (tests/bench/trainer_bench.py measures the tiny model only); the project's one
  measurement with real weights (its notes, LESSONS.md: 20 LoRA steps of SmolLM2-135M took ~220 s on a
  2-core dev host; batch and row lengths not recorded) fits 10-20 GFLOPS for short rows, and the lower
  end is taken: a forecast that errs long only raises the default runtime limit.

DPO (training.method dpo): a row is a preference pair, and its bytes (prompt once, both answers) stand for
  the tokens of its two sequences (prompt + chosen, prompt + rejected; at most 2 x max_seq_len), which the trained model runs
  forward and backward. The reference model (the base with the adapter disabled) runs the same two
  sequences forward only, 2N per token more: FLOPs per token x (1 + 2 / (6 or 4)), i.e. x 4/3 with
  gradient checkpointing, x 3/2 without (dpo_factor). The prompt counted once where it is run twice makes
  the estimate short by the prompt's share; the default limit's margin is for that. Like runs (measured
  pace) are DPO runs only: their measured pace already holds the reference passes.

Startup: a fixed allowance (startup_s)
  cloud: machine boot and cloud-init 2 min, image pull 2 min (the trainer image with torch and CUDA is
  several GB), then the base model's bf16 weights (2 bytes per parameter; a 4-bit run downloads the
  same files) downloaded and loaded at 50 MB/s together (~100 MB/s from the hub, then read again).
  local: 1 min (a process on the host: torch and transformers imports took 7-26 s on the dev host,
  then the model is built or loaded from the local cache).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass

from adapter_format.base_models import DeclaredModel
from shared.clock import now
from shared.context import Context
from shared.models import DatasetVersionRecord, Forecast, ForecastCheck, GpuOffer, RunRecord, TrainingSettings
from shared.providers.registry import declaration

TOKENS_SOURCE = "estimated from bytes"
BYTES_PER_TOKEN = 4
# The trainer's held-out split (machine/trainer/lora.py MIN_EVAL_EXAMPLES, MAX_EVAL_EXAMPLES).
MIN_EVAL_ROWS = 20
MAX_EVAL_ROWS = 256

QLORA_SPEED = 0.72
SMALL_MODEL_PARAMS = 1_000_000_000
SMALL_MODEL_MFU = 0.5

CLOUD_BOOT_S = 120
CLOUD_IMAGE_PULL_S = 120
MODEL_FETCH_BYTES_PER_S = 50e6

# A check shorter than this measured too little to stand for a throughput (imports, first-step warm-up).
MIN_MEASURED_S = 10.0
# The trainer's figures taken as a measurement: below 0.1 tokens/s not even a 7B model on a CPU core
# trains; 10M tokens/s is far above a small model on the fastest GPU; a run is at most 30 days.
MIN_TOKENS_PER_S = 0.1
MAX_TOKENS_PER_S = 1e7
MAX_TRAIN_S = 30 * 86400
MAX_TOKENS = 10**13

# The default runtime limit from a forecast: this margin over its total, rounded up to RUNTIME_STEP_S.
RUNTIME_MARGIN = 1.5
RUNTIME_STEP_S = 600


@dataclass(frozen=True)
class Gpu:
    """One row of the throughput table: the GPU's peak dense TFLOPS and the utilisation assumed."""

    name: str
    pattern: str  # matched (case-insensitive) against the offer's gpu name, as each provider spells it
    bf16_tflops: float
    fp32_tflops: float
    mfu: float


# Vendor datasheets, dense figures (bf16 tensor with fp32 accumulate; fp32 non-tensor). The more
# specific name first: "H100 PCIe" before "H100".
GPUS = [
    Gpu("B200", r"\bB200\b", 2250, 75, 0.35),
    Gpu("H200", r"\bH200\b", 989, 67, 0.40),
    Gpu("H100 PCIe", r"\bH100\b.*\bPCIe\b", 756, 51, 0.40),
    Gpu("H100 NVL", r"\bH100\b.*\bNVL\b", 835, 60, 0.40),
    Gpu("H100", r"\bH100\b", 989, 67, 0.40),  # SXM
    Gpu("A100", r"\bA100\b", 312, 19.5, 0.40),
    Gpu("L40S", r"\bL40S\b", 362, 91.6, 0.35),
    Gpu("L40", r"\bL40\b", 181, 90.5, 0.35),
    Gpu("L4", r"\bL4\b", 121, 30.3, 0.30),
    # AWS publishes no dense bf16 figure for its A10G variant: half the A10's, so it errs long.
    Gpu("A10G", r"\bA10G\b", 62.5, 31.2, 0.35),
    Gpu("A10", r"\bA10\b", 125, 31.2, 0.35),
    Gpu("A40", r"\bA40\b", 150, 37.4, 0.35),
    Gpu("A30", r"\bA30\b", 165, 10.3, 0.35),
    Gpu("RTX 6000 Ada", r"\b6000 Ada\b", 364, 91.1, 0.35),
    Gpu("RTX A6000", r"\bA6000\b", 155, 38.7, 0.35),
    Gpu("RTX A5000", r"\bA5000\b", 111, 27.8, 0.35),
    Gpu("RTX A4500", r"\bA4500\b", 94.6, 23.7, 0.35),
    Gpu("RTX A4000", r"\bA4000\b", 76.7, 19.2, 0.35),
    Gpu("RTX 5090", r"\b5090\b", 209, 104.8, 0.35),
    Gpu("RTX 4090", r"\b4090\b", 165, 82.6, 0.35),
    Gpu("RTX 3090", r"\b3090\b", 71, 35.6, 0.35),
]
UNKNOWN_GPU = Gpu("a GPU not in the table (taken as an entry-level Ampere card)", "", 60, 15, 0.30)


def gpu_figures(gpu_name: str) -> Gpu:
    for gpu in GPUS:
        if re.search(gpu.pattern, gpu_name, re.IGNORECASE):
            return gpu
    return UNKNOWN_GPU


def compute_params(model: DeclaredModel) -> int:
    """N: the parameters a token is multiplied by. The input embeddings are a lookup; a tied lm_head
    is counted once in param_count and is a real matmul, so only an untied model's embeddings go."""
    embeddings = 0 if model.tie_embeddings else model.vocab_size * model.hidden_size
    return model.param_count() - embeddings


def flops_per_token(model: DeclaredModel, training: TrainingSettings) -> float:
    per_param = 6 if training.gradient_checkpointing else 4
    return per_param * compute_params(model)


def dpo_factor(training: TrainingSettings) -> float:
    """The cost of a DPO token over an SFT one: the reference model's forward pass (2N) beside the
    trained model's 6N (4N without gradient checkpointing); 1 for sft."""
    if training.method != "dpo":
        return 1.0
    return 1 + 2 / (6 if training.gradient_checkpointing else 4)


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float
    why: str


def throughput(model: DeclaredModel, offer: GpuOffer, training: TrainingSettings) -> Throughput:
    per_token = flops_per_token(model, training)
    formula = (f"{'6' if training.gradient_checkpointing else '4'} x {compute_params(model) / 1e9:.3g}B params "
               f"per token (LoRA{', gradient checkpointing' if training.gradient_checkpointing else ''})")
    if training.method == "dpo":
        per_token *= dpo_factor(training)
        formula += f" x {dpo_factor(training):.3g} (DPO: the reference model's forward pass)"
    cpu = declaration(offer.provider).trains_on_cpu
    if cpu is not None:
        rate = cpu.gflops * 1e9 / per_token
        return Throughput(rate, f"{offer.provider} CPU: an effective {cpu.gflops:g} GFLOPS (fp32) / {formula}")
    gpu = gpu_figures(offer.gpu)
    fp32 = training.precision == "fp32"
    peak = gpu.fp32_tflops if fp32 else gpu.bf16_tflops
    mfu = gpu.mfu * (SMALL_MODEL_MFU if compute_params(model) < SMALL_MODEL_PARAMS else 1.0)
    rate = peak * 1e12 * mfu / per_token
    why = f"{gpu.name}: {peak:g} TFLOPS {'fp32' if fp32 else 'bf16'} dense x {mfu:.1%} MFU"
    if mfu < gpu.mfu:
        why += f" (half of {gpu.mfu:.0%}: a model under {SMALL_MODEL_PARAMS / 1e9:g}B)"
    why += f" / {formula}"
    if training.load_in_4bit:
        rate *= QLORA_SPEED
        why += f" x {QLORA_SPEED} (4-bit)"
    return Throughput(rate, why)


@dataclass(frozen=True)
class Measured:
    """A finished run's measured throughput, as the forecast of a like run uses it."""

    run_id: str
    tokens_per_s: float


def like_key(provider: str, base_model: str, gpu: str, training: TrainingSettings) -> str:
    """The index row of like runs: what changes the cost of a token (a hash: GPU and model names hold
    characters a table key may not)."""
    like = [provider, base_model, gpu, training.precision, training.load_in_4bit, training.gradient_checkpointing]
    if training.method == "dpo":  # appended only for dpo: the keys of SFT runs measured before stay the same
        like.append("dpo")
    return hashlib.sha256(json.dumps(like).encode()).hexdigest()[:40]


def usable_rate(tokens_per_s: object) -> bool:
    return (isinstance(tokens_per_s, int | float) and not isinstance(tokens_per_s, bool)
            and math.isfinite(tokens_per_s) and MIN_TOKENS_PER_S <= tokens_per_s <= MAX_TOKENS_PER_S)


def record_measured(ctx: Context, run: RunRecord) -> bool:
    """Keep a verified run's measured throughput as the last of its like runs (an upsert: a repeated
    verify writes the same row). Only a check of at least MIN_MEASURED_S with a usable rate."""
    c = run.forecast_check
    if c is None or c.training_s < MIN_MEASURED_S or not usable_rate(c.throughput_tokens_per_s):
        return False
    ctx.store.throughput.put(run.org, like_key(run.provider, run.base_model, run.offer.gpu, run.training), {
        "run_id": run.id, "tokens_per_s": c.throughput_tokens_per_s, "training_s": c.training_s,
        "at": now().isoformat(), "provider": run.provider, "base_model": run.base_model, "gpu": run.offer.gpu,
        "precision": run.training.precision})
    return True


def measured_for(ctx: Context, org: str, provider: str, base_model: str, gpu: str,
                 training: TrainingSettings) -> Measured | None:
    """The last measured throughput of a like run in the org (one point read of the index), or None."""
    row = ctx.store.throughput.get(org, like_key(provider, base_model, gpu, training))
    if row is None or not usable_rate(row.get("tokens_per_s")) or not isinstance(row.get("run_id"), str):
        return None
    return Measured(row["run_id"], float(row["tokens_per_s"]))


def training_rows(rows: int, training: TrainingSettings) -> int:
    """The rows the trainer trains on: max_examples applied, the eval split held out (as lora.split)."""
    used = min(rows, training.max_examples) if training.max_examples is not None else rows
    held = 0
    if used >= MIN_EVAL_ROWS and training.eval_fraction > 0:
        held = min(MAX_EVAL_ROWS, max(1, int(used * training.eval_fraction)))
    return used - held


def planned_steps(rows: int, training: TrainingSettings) -> int:
    """The optimizer steps the trainer plans (as lora.plan_steps over training_rows)."""
    if training.max_steps is not None:
        return training.max_steps
    micro_per_epoch = math.ceil(training_rows(rows, training) / training.batch_size)
    steps_per_epoch = max(1, math.ceil(micro_per_epoch / training.gradient_accumulation))
    return max(1, math.ceil(training.epochs * steps_per_epoch))


def tokens_per_example(dataset: DatasetVersionRecord, training: TrainingSettings) -> int:
    per_row = math.ceil(dataset.size_bytes / max(1, dataset.rows) / BYTES_PER_TOKEN)
    # A pair is two sequences, each cut at max_seq_len.
    return max(1, min(per_row, training.max_seq_len * (2 if training.method == "dpo" else 1)))


def startup_s(model: DeclaredModel, offer: GpuOffer) -> tuple[int, str]:
    cpu = declaration(offer.provider).trains_on_cpu
    if cpu is not None:
        return cpu.startup_s, f"startup {cpu.startup_s // 60} min (a {offer.provider} process: imports, model load)"
    weights = 2 * model.param_count()
    fetch = math.ceil(weights / MODEL_FETCH_BYTES_PER_S)
    why = (f"startup: boot {CLOUD_BOOT_S // 60} min + image pull {CLOUD_IMAGE_PULL_S // 60} min + "
           f"{weights / 1e9:.2g} GB of weights at {MODEL_FETCH_BYTES_PER_S / 1e6:g} MB/s ({fetch} s)")
    return CLOUD_BOOT_S + CLOUD_IMAGE_PULL_S + fetch, why


def predict(dataset: DatasetVersionRecord, training: TrainingSettings, model: DeclaredModel, offer: GpuOffer,
         measured: Measured | None = None) -> Forecast:
    """The forecast of a run with these resolved settings (trial bounds applied) on this offer; with
    `measured`, at that like run's measured throughput instead of the table's."""
    steps = planned_steps(dataset.rows, training)
    examples = steps * training.batch_size * training.gradient_accumulation
    per_example = tokens_per_example(dataset, training)
    tokens = examples * per_example
    rate = throughput(model, offer, training)
    # The table is an assumption: the first run of a model on a GPU (or on this host's CPU) took 12 min
    # where it said 2 (issue 31). Said with the forecast until a like run's measured pace replaces it.
    cpu = declaration(offer.provider).trains_on_cpu
    where = cpu.where if cpu is not None else f"on {offer.gpu}"
    uncertainty = (f"no run of this model measured {where} yet: the pace is a table estimate, it may be several "
                   "times off (a finished run's measured pace replaces it for the next ones)")
    if measured is not None and usable_rate(measured.tokens_per_s):  # never a division by 0 or by inf
        uncertainty = ""
        rate = Throughput(measured.tokens_per_s, f"measured by run {measured.run_id} (same model, GPU and settings; "
                                                 f"the table said {rate.tokens_per_s:,.1f})")
    train_s = math.ceil(tokens / rate.tokens_per_s)
    start_s, start_why = startup_s(model, offer)
    total_s = start_s + train_s
    basis = (f"{tokens:,} tokens = {steps} steps x {examples // steps} examples (batch {training.batch_size} x "
             f"accumulation {training.gradient_accumulation}) x {per_example} tokens ({dataset.size_bytes:,} bytes / "
             f"{dataset.rows:,} rows / {BYTES_PER_TOKEN} bytes per token, at most max_seq_len {training.max_seq_len}); "
             f"{rate.tokens_per_s:,.1f} tokens/s = {rate.why}; {start_why}; "
             f"cost at {offer.total_per_hour:g} {offer.currency}/h")
    return Forecast(training_s=train_s, startup_s=start_s, total_s=total_s,
                    cost=round(total_s / 3600 * offer.total_per_hour, 4), tokens=tokens, tokens_source=TOKENS_SOURCE,
                    steps=steps, throughput_tokens_per_s=round(rate.tokens_per_s, 1), basis=basis,
                    uncertainty=uncertainty)


def runtime_limit_for(forecast: Forecast) -> int:
    """A runtime limit that leaves the forecast a margin: RUNTIME_MARGIN x its total, rounded up to
    whole RUNTIME_STEP_S (the tokens are an estimate from bytes; the table is an assumption)."""
    return math.ceil(forecast.total_s * RUNTIME_MARGIN / RUNTIME_STEP_S) * RUNTIME_STEP_S


def minutes(seconds: float) -> str:
    """Seconds as a person reads an estimate: '40 s', '12 min', '2.5 h'."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 2 * 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def to_the_second(seconds: float) -> str:
    """Seconds as minutes and seconds ('1 min 15 s'): when two durations compared read the same in
    minutes() ('~1 min ... longer than ... 1 min'), the sentence says them to the second."""
    m, s = divmod(max(0, round(seconds)), 60)
    return f"{s} s" if not m else f"{m} min" + (f" {s} s" if s else "")


def apart(a: float, b: float) -> tuple[str, str]:
    """a and b as minutes() says them, or to the second when that would say them alike."""
    return (minutes(a), minutes(b)) if minutes(a) != minutes(b) else (to_the_second(a), to_the_second(b))


def summary(forecast: Forecast, currency: str = "USD") -> str:
    """One line, as the CLI prints it: '~12 min training + 4 min start, ~$0.35 (tokens estimated from bytes)'."""
    cost = f"${forecast.cost:.2f}" if currency == "USD" else f"{forecast.cost:.2f} {currency}"
    return (f"~{minutes(forecast.training_s)} training + {minutes(forecast.startup_s)} start, ~{cost} "
            f"(tokens {forecast.tokens_source})")


def warnings(forecast: Forecast, price_limit_per_hour: float, runtime_limit_s: int, currency: str) -> list[str]:
    """What a draft's limits will not cover. Warnings, not refusals: the forecast is an estimate.

    The price limit is per hour, so what the run's limits let it spend is price_limit_per_hour over
    the runtime limit; a forecast cost above that means one of them stops the run before it ends."""
    budget = price_limit_per_hour * runtime_limit_s / 3600
    if forecast.cost > budget:
        return [f"the forecast costs ~{forecast.cost:.2f} {currency} ({minutes(forecast.total_s)}), more than this "
                f"run's limits allow it to spend: price_limit_per_hour {price_limit_per_hour:g}/h over the runtime "
                f"limit of {minutes(runtime_limit_s)} is {budget:.2f} {currency}; raise price_limit_per_hour or "
                "runtime_limit_s, or train fewer steps (training max_steps). Launch is not refused for this"]
    if forecast.total_s > runtime_limit_s:
        # Within the price, but the runtime limit ends first: the run would be retained, not succeed.
        need, limit = apart(forecast.total_s, runtime_limit_s)
        return [f"the forecast needs ~{need} ({minutes(forecast.startup_s)} start + "
                f"{minutes(forecast.training_s)} training), longer than the runtime limit of "
                f"{limit}: the run would be retained at the limit (stopped, its output "
                "kept), not succeed; raise runtime_limit_s or train fewer steps (training max_steps)"]
    return []


def compare(predicted: Forecast, measured: dict[str, object]) -> ForecastCheck | None:
    """The forecast against the trainer's manifest figures (train_seconds, tokens, steps, as the
    verifier read them), or None when the manifest has none (the smoke trainer, older trainers).
    Only the training part is checked: the startup allowance is not measured by the trainer."""
    seconds, tokens, steps = measured.get("train_seconds"), measured.get("tokens"), measured.get("steps")
    if unusable(measured) is not None or not isinstance(seconds, int | float) or not isinstance(tokens, int):
        return None
    return ForecastCheck(training_s=round(float(seconds), 3), tokens=tokens,
                         steps=steps if isinstance(steps, int) else predicted.steps,
                         training_error=round(predicted.training_s / seconds - 1, 4),
                         tokens_error=round(predicted.tokens / tokens - 1, 4),
                         throughput_tokens_per_s=round(tokens / seconds, 1))


def unusable(measured: dict[str, object]) -> str | None:
    """Why the trainer's figures cannot be a measurement (out of range, not numbers), or None when they
    can; also None when there are none (nothing to say: the smoke trainer measures nothing)."""
    seconds, tokens = measured.get("train_seconds"), measured.get("tokens")
    if seconds is None and tokens is None:
        return None
    if (not isinstance(seconds, int | float) or isinstance(seconds, bool) or not math.isfinite(seconds)
            or not 0 < seconds <= MAX_TRAIN_S):
        return f"train_seconds {seconds!r:.40} is not a number of seconds from 0 to {MAX_TRAIN_S}"
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 < tokens <= MAX_TOKENS:
        return f"tokens {tokens!r:.40} is not a whole number from 1 to {MAX_TOKENS:.0e}"
    if not MIN_TOKENS_PER_S <= tokens / seconds <= MAX_TOKENS_PER_S:
        return (f"{tokens} tokens in {seconds:g} s is {tokens / seconds:.3g} tokens/s, outside "
                f"{MIN_TOKENS_PER_S:g}..{MAX_TOKENS_PER_S:.0e}")
    return None


def check_summary(c: ForecastCheck) -> str:
    """'forecast vs measured: training 12 min vs 9.5 min (forecast 26 % long), tokens ...'."""
    def off(error: float) -> str:
        return f"{abs(error):.0%} {'long' if error >= 0 else 'short'}"

    return (f"forecast vs measured: training {minutes(c.training_s * (1 + c.training_error))} forecast vs "
            f"{minutes(c.training_s)} measured (forecast {off(c.training_error)}), tokens {c.tokens:,} measured "
            f"(forecast {off(c.tokens_error)}), {c.throughput_tokens_per_s:,.1f} tokens/s measured")
