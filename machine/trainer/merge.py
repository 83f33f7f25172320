"""The adapter merged into its base model's weights (training.merged): a second artifact beside the
adapter, for people who serve a plain model rather than base + adapter.

After the adapter is written, the base model is loaded again in its own dtype (the checkpoint's:
bf16 for every declared hub model), the adapter just written is applied with peft and folded in with
merge_and_unload (LoRA: W + B @ A x scale; DoRA: the magnitude-normalised weight), and the result is
saved as config.json, generation_config.json and model.safetensors (or model-0000k-of-0000n.safetensors
shards with model.safetensors.index.json), plus manifest.json listing each file's sha256. Written to
<output>/.merged.partial and renamed to <output>/merged when whole; the agent exports that folder as
merged.zip. Where: the GPU when the run trained there unquantized (the freed training model held at
least these weights), else the CPU (a 4-bit run's GPU need not hold the bf16 weights).

A merge that fails (memory, a base model that will not load again) is logged and leaves no folder: the
adapter is the run's product, and the run succeeds without the merged model, saying why.
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

MERGED_DIR = "merged"
MANIFEST_NAME = "manifest.json"
# Shards well under what a merged archive may hold (adapter_format.base_models.MAX_MERGED_BYTES).
MAX_SHARD_SIZE = "2GB"
# What save_pretrained writes that the merged archive carries; anything else it writes is left out.
_KEPT = re.compile(r"^(config\.json|generation_config\.json|model\.safetensors(\.index\.json)?"
                   r"|model-\d{5}-of-\d{5}\.safetensors)$")


def log(message: str) -> None:
    print(message, flush=True)


def merge_adapter(source: str, adapter_dir: Path, *, device: str = "cpu", token: str | None = None) -> Any:
    """The base model at `source` (in its checkpoint's dtype) with the adapter in adapter_dir folded into
    its weights: a plain transformers model, no peft layer left."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(source, dtype="auto", token=token)
    if device != "cpu":
        base.to(device)  # type: ignore[arg-type]  # transformers types .to() as a wrapped method
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()


def write_merged(model: Any, out: Path, base_model: str, adapter_sha256: str) -> Path:
    """model saved to out/merged (through out/.merged.partial) with a manifest; returns the folder."""
    partial, final = out / ".merged.partial", out / MERGED_DIR
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True, max_shard_size=MAX_SHARD_SIZE)
    for extra in partial.iterdir():
        if not _KEPT.match(extra.name):
            shutil.rmtree(extra) if extra.is_dir() else extra.unlink()
    files = {p.name: {"sha256": _sha256(p), "size": p.stat().st_size} for p in sorted(partial.iterdir())}
    manifest = {"format": 1, "kind": "merged", "base_model": base_model, "adapter_sha256": adapter_sha256,
                "dtype": str(model.dtype).removeprefix("torch."), "files": files}
    (partial / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


def free_memory(cuda: bool) -> None:
    gc.collect()
    if cuda:
        import torch

        torch.cuda.empty_cache()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def merge_into_output(source: str, out: Path, base_model: str, *, device: str, token: str | None) -> bool:
    """The run's adapter in out merged and written to out/merged; False (logged, no folder) when it fails."""
    adapter_sha256 = _sha256(out / "adapter_model.safetensors")
    log(f"trainer: merging the adapter into {base_model}'s weights on the {device} (training.merged)")
    try:
        model = merge_adapter(source, out, device=device, token=token)
        folder = write_merged(model, out, base_model, adapter_sha256)
    except (OSError, ValueError, RuntimeError, ImportError) as exc:  # torch's out-of-memory is a RuntimeError
        shutil.rmtree(out / ".merged.partial", ignore_errors=True)
        log(f"trainer: the merged model was not written ({type(exc).__name__}: {str(exc)[:300]}); the adapter is "
            "complete and is the run's output")
        return False
    finally:
        gc.collect()
    size = sum(p.stat().st_size for p in folder.iterdir())
    log(f"trainer: wrote the merged model to {folder} ({size} bytes)")
    return True
