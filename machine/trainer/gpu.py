"""The trainer's own GPU checks: a GPU that torch cannot use (the driver), NEFTune's noise, and the
timed probe that lets `batching: auto` choose between grouped and packed on a GPU.

A driver older than the pinned torch's CUDA runtime needs makes torch.cuda.is_available() False
with no error at all: the trainer would train on the CPU, for hours, on a GPU machine. The agent
checks the driver before its first report (machine/agent/gpu.py, from the image's
TENSORANT_MIN_NVIDIA_DRIVER); this is the trainer's check for any other way torch misses the GPU
(a trainer run by hand, an image without the setting): an NVIDIA driver is present, torch sees no
GPU: exit EXIT_GPU with the driver's version and what to do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from machine.agent.gpu import DRIVER_FILE, EXIT_GPU, driver_version
from machine.trainer.batches import FLEX, batch_stream, collate, set_attention, trained_tokens
from machine.trainer.loss import loss_sum

__all__ = ["EXIT_GPU", "Neftune", "choice_name", "gpu_problem", "probe_batching"]
PROBE_BATCHES = 4  # timed micro-batches per mode, after one untimed (kernels load, the allocator warms)


def gpu_problem(driver_file: str = DRIVER_FILE) -> str | None:
    """Why this machine's GPU cannot be used by torch, or None (torch has a GPU, or there is no NVIDIA
    driver at all: a CPU machine, which trains on the CPU)."""
    import torch

    if torch.cuda.is_available():
        return None
    found = driver_version(driver_file)
    if found is None:
        return None
    runtime = torch.version.cuda
    if runtime is None:
        return (f"this machine has an NVIDIA driver ({found}) but this PyTorch {torch.__version__} is a CPU "
                "build: install the CUDA build of torch (machine/trainer/requirements.txt's pin from PyPI)")
    try:  # the CUDA version the driver supports, e.g. 12020 for 12.2 (0 when libcuda is missing)
        supports = int(getattr(torch._C, "_cuda_getDriverVersion")())  # noqa: B009 (private: not in the stubs)
    except (AttributeError, RuntimeError):
        supports = 0
    said = f", which supports CUDA {supports // 1000}.{supports % 1000 // 10}" if supports else ""
    return (f"the GPU cannot be used: the NVIDIA driver is {found}{said}, and this PyTorch {torch.__version__} "
            f"needs CUDA {runtime} (CUDA 13: driver 580 or newer); training would run on the CPU instead. "
            "Use a machine image with a newer NVIDIA driver (or update the driver) and launch again")


class Neftune:
    """NEFTune (Jain et al., 2023; TRL's neftune_noise_alpha): while training, uniform noise in
    [-1, 1] x alpha / sqrt(L x d) is added to the input embeddings, L the example's length and d the
    hidden size. L is each example's own length (per row of a padded batch, per token of a packed
    row), not the padded or packed row's, so packing does not shrink the noise. No noise in eval."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.lengths: Any = None

    def attach(self, model: Any) -> None:
        model.get_input_embeddings().register_forward_hook(self.hook)

    def set_inputs(self, inputs: dict[str, Any]) -> None:
        """The example lengths of the micro-batch about to run (collate's output)."""
        import torch

        if "example_starts" in inputs:
            starts = inputs["example_starts"]
            sizes = starts[1:] - starts[:-1]
            per_token = torch.repeat_interleave(sizes, sizes)
            self.lengths = per_token.to(inputs["input_ids"].device)[None, :, None].float()
        else:
            self.lengths = inputs["attention_mask"].sum(dim=1).clamp(min=1)[:, None, None].float()

    def hook(self, module: Any, args: Any, output: Any) -> Any:
        import torch

        if not module.training or self.lengths is None:
            return output
        scale = self.alpha / torch.sqrt(self.lengths * output.shape[-1])
        return output + torch.zeros_like(output).uniform_(-1, 1) * scale.to(output.dtype)


def choice_name(mode: str, attention: str | None) -> str:
    """A probed choice's name in the probe's figures (the manifest's batching_probe): grouped, packed
    (segment attention, flash attention or as loaded) or packed_flex."""
    return f"{mode}_flex" if attention == FLEX else mode


def probe_batching(model: Any, examples: Sequence[Any], batch_size: int, seed: int, pad_id: int, device: Any,
                   neftune: Neftune | None = None, choices: Sequence[tuple[str, str | None]] = (
                       ("grouped", None), ("packed", None))) -> tuple[tuple[str, str | None], dict[str, float]]:
    """`auto` on a GPU, decided by measurement: PROBE_BATCHES micro-batches of each (batching mode,
    attention implementation) of choices (batches.candidates; attention None: as it is), forward and
    backward, no optimizer step, timed after one untimed batch (two under flex attention: torch
    compiles for the first row length, then once more for any length); the choice with more real
    tokens per second wins, and the model is left under its attention. Flex attention compiles with
    Triton at its first call: where that fails it is said, given 0 and left out. Nothing of training
    changes: gradients are dropped and the RNG (dropout, noise) is put back, so the run is the one it
    would have been. Returns (the choice, {choice_name: real tokens per second})."""
    import torch

    cuda = device.type == "cuda"
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if cuda else None
    rates: dict[str, float] = {}
    for mode, attention in choices:
        set_attention(model, attention)
        try:
            rates[choice_name(mode, attention)] = _rate(model, examples, batch_size, seed, pad_id, device, neftune,
                                                        mode, warmup=2 if attention == FLEX else 1)
        except Exception as exc:  # only flex's is caught: the other choices still train this run
            if attention != FLEX:
                raise
            print(f"trainer: flex attention failed in the batching probe and is not used: {type(exc).__name__}: "
                  f"{str(exc)[:300]}", flush=True)
            rates[choice_name(mode, attention)] = 0.0
        model.zero_grad(set_to_none=True)
    torch.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state_all(cuda_rng)
    best = max(choices, key=lambda c: rates[choice_name(*c)])
    set_attention(model, best[1])
    return best, rates


def _rate(model: Any, examples: Sequence[Any], batch_size: int, seed: int, pad_id: int, device: Any,
          neftune: Neftune | None, mode: str, *, warmup: int) -> float:
    """Real tokens per second of PROBE_BATCHES micro-batches of mode, forward and backward, after warmup."""
    import torch

    cuda = device.type == "cuda"
    stream = batch_stream(examples, batch_size, seed, grouped=mode == "grouped")
    tokens, started = 0, 0.0
    for i in range(PROBE_BATCHES + warmup):
        batch = next(stream)[1]
        if i == warmup:
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
        n = trained_tokens(batch)
        if n == 0:
            continue
        inputs = collate(batch, pad_id, device, mode)
        if neftune is not None:
            neftune.set_inputs(inputs)
        (loss_sum(model, inputs, n) / n).backward()
        if i >= warmup:
            tokens += sum(len(t.input_ids) for t in batch)
    if cuda:
        torch.cuda.synchronize()
    return round(tokens / max(time.perf_counter() - started, 1e-9), 1)
