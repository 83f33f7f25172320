"""The smoke adapter: a PEFT-shaped LoRA adapter with random small values and nothing learned.

The smoke trainer (machine.trainer.smoke) writes these files, and tests build valid
and deliberately broken archives from them (tests/support/adapters.py's `build_adapter_zip`). One code
path for both, so the verifier is tested on exactly what the smoke trainer produces.

The safetensors file is written by hand (8-byte little-endian header length, JSON header,
raw little-endian tensor data): no torch or safetensors package is needed.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable

import numpy as np

from adapter_format.base_models import DeclaredModel, get_base_model

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
MANIFEST_NAME = "manifest.json"
SMOKE_TRAINER = "smoke (no training)"

_NUMPY_DTYPES = {"F32": "<f4", "F16": "<f2"}


def tensor_name(layer: int, module: str, ab: str) -> str:
    """PEFT's key for a Llama-style attention projection."""
    return f"base_model.model.model.layers.{layer}.self_attn.{module}.lora_{ab}.weight"


def _to_bytes(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        # bfloat16 is the top half of a float32 (truncation is fine for random values).
        bits = values.astype("<f4").view("<u4") >> 16
        return bits.astype("<u2").tobytes()
    return values.astype(_NUMPY_DTYPES[dtype]).tobytes()


def write_safetensors(tensors: dict[str, tuple[str, list[int], bytes]],
                      metadata: dict[str, str] | None = None) -> bytes:
    """Serialize {name: (dtype, shape, raw bytes)} in the safetensors layout."""
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in tensors.values())


def adapter_config(base_model: str, r: int, targets: Iterable[str]) -> dict[str, object]:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": r,
        "lora_alpha": 2 * r,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(targets),
        "inference_mode": True,
    }


def _declared(base_model: str) -> DeclaredModel:
    model = get_base_model(base_model)
    if model is None:
        raise ValueError(f"base model {base_model!r} is not declared in adapter_format.base_models; "
                         "the smoke adapter needs its shapes")
    return model


def build_adapter_files(base_model: str, *, rows: int = 0, r: int = 8, dtype: str = "F32",
                        seed: int = 0, model: DeclaredModel | None = None) -> dict[str, bytes]:
    """adapter_config.json, adapter_model.safetensors and manifest.json for a declared model (or `model`'s
    shapes: a Hub model's, read from its config.json)."""
    model = model or _declared(base_model)
    files = {
        CONFIG_NAME: json.dumps(adapter_config(base_model, r, model.default_targets), indent=2).encode(),
        WEIGHTS_NAME: smoke_weights(model, r=r, dtype=dtype, seed=seed),
    }
    files[MANIFEST_NAME] = manifest_bytes(base_model, files, rows=rows, trainer=SMOKE_TRAINER)
    return files


def manifest_bytes(base_model: str, files: dict[str, bytes], *, rows: int | None, trainer: str,
                   measured: dict[str, float] | None = None) -> bytes:
    manifest: dict[str, object] = {
        "format": 1,
        "base_model": base_model,
        "rows": rows,
        "trainer": trainer,
        "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                  for name, data in sorted(files.items())},
        **(measured or {}),
    }
    return json.dumps(manifest, indent=2).encode()


def smoke_weights(model: DeclaredModel, *, r: int, dtype: str, seed: int, nan: bool = False,
             wrong_rank: bool = False) -> bytes:
    """The smoke weights: random lora_A/lora_B of rank r for every default target; broken on demand with a NaN in
    the first lora_A, or the first lora_B of rank r+1 (the same random values either way)."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, tuple[str, list[int], bytes]] = {}
    for layer in range(model.num_layers):
        for module in model.default_targets:
            n_in, n_out = model.modules[module]
            a = rng.normal(0.0, 0.01, size=(r, n_in))
            rb = r + 1 if wrong_rank and not tensors else r
            b = rng.normal(0.0, 0.01, size=(n_out, rb))
            if nan and not tensors:
                a[0, 0] = np.nan
            tensors[tensor_name(layer, module, "A")] = (dtype, [r, n_in], _to_bytes(a, dtype))
            tensors[tensor_name(layer, module, "B")] = (dtype, [n_out, rb], _to_bytes(b, dtype))
    return write_safetensors(tensors, {"format": "pt"})
