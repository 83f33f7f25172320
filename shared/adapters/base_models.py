"""Declared base models: the layer count and the in/out size of each LoRA target module.

The verifier uses this table to check lora_A [r, in] and lora_B [out, r] against the
model the run names. A base model that is not declared here is still accepted; only
its in/out sizes and layer count go unchecked (the verifier says so in its summary).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BaseModel:
    name: str
    hidden_size: int
    num_layers: int
    modules: dict[str, tuple[int, int]]  # module name -> (in_features, out_features)
    default_targets: tuple[str, ...]


def _attention(hidden: int, kv_dim: int) -> dict[str, tuple[int, int]]:
    """q/k/v/o projections of a grouped-query attention block."""
    return {
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, kv_dim),
        "v_proj": (hidden, kv_dim),
        "o_proj": (hidden, hidden),
    }


BASE_MODELS: dict[str, BaseModel] = {
    # Exists only so the smoke trainer and the verifier have shapes to check; no weights.
    "tensorant/smoke-tiny": BaseModel(
        name="tensorant/smoke-tiny",
        hidden_size=64,
        num_layers=2,
        modules={"q_proj": (64, 64), "v_proj": (64, 64)},
        default_targets=("q_proj", "v_proj"),
    ),
    # 32 heads x 64, 8 key/value heads -> k/v project to 512.
    "meta-llama/Llama-3.2-1B": BaseModel(
        name="meta-llama/Llama-3.2-1B",
        hidden_size=2048,
        num_layers=16,
        modules=_attention(2048, 512),
        default_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
    ),
    # 14 heads x 64, 2 key/value heads -> k/v project to 128.
    "Qwen/Qwen2.5-0.5B": BaseModel(
        name="Qwen/Qwen2.5-0.5B",
        hidden_size=896,
        num_layers=24,
        modules=_attention(896, 128),
        default_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
    ),
    # 32 heads x 128, 8 key/value heads -> k/v project to 1024.
    "mistralai/Mistral-7B-v0.1": BaseModel(
        name="mistralai/Mistral-7B-v0.1",
        hidden_size=4096,
        num_layers=32,
        modules=_attention(4096, 1024),
        default_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
    ),
}


def get_base_model(name: str) -> BaseModel | None:
    return BASE_MODELS.get(name)
