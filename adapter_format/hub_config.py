"""A base model's shapes from its Hub `config.json`: the DeclaredModel that the verifier and the memory fit read
for a model named by its Hub id and revision (shared/runs/hub_models.py fetches and keeps it).

The config is untrusted (anyone can publish one): only the architectures below are accepted, every size is an
integer within a bound, and nothing else of the file is kept. The parameter count comes from the checkpoint
itself where it says (the safetensors index's total_size over the dtype's width, or a single file's header);
otherwise from the shapes.
"""

from __future__ import annotations

from typing import Any

from adapter_format.base_models import ATTENTION, FUSED_ATTENTION, DeclaredModel

# transformers' architecture name -> the DeclaredModel architecture whose module shapes it has.
SUPPORTED = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "BF16": 2, "F16": 2, "F32": 4}
_MAX_DIM = 1 << 20  # hidden, intermediate, head sizes: today's largest are ~1e5
_MAX_LAYERS = 1024
_MAX_VOCAB = 1 << 22
MAX_PARAMS = 2 * 10**12


class ConfigRefused(ValueError):
    """config.json names no supported architecture or has a size out of bounds; the message says which."""


def _int(config: dict[str, Any], key: str, bound: int, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None and default is None:
        raise ConfigRefused(f"config.json has no {key}")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
        raise ConfigRefused(f"config.json's {key} must be an integer from 1 to {bound}, not {value!r:.40}")
    return value


def architecture_of(config: dict[str, Any]) -> str:
    names = config.get("architectures")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigRefused("config.json has no architectures list; it is not a transformers causal LM checkpoint")
    supported = [SUPPORTED[n] for n in names if n in SUPPORTED]
    if not supported:
        raise ConfigRefused(f"architecture {', '.join(n[:60] for n in names[:3])} is not supported; supported: "
                            f"{', '.join(SUPPORTED)}")
    return supported[0]


def model_from_config(name: str, config: dict[str, Any], params: int = 0) -> DeclaredModel:
    """The shapes of `name` from its config.json (a text config nested under text_config is read too)."""
    if not isinstance(config, dict):
        raise ConfigRefused("config.json is not a JSON object")
    arch = architecture_of(config)
    text = config.get("text_config")
    c = text if isinstance(text, dict) else config
    hidden, heads, kv_heads, head_dim = _attention_shape(c)
    tie = c.get("tie_word_embeddings", arch in ("gemma2", "gemma3"))  # Gemma ties by default
    if params and not 1 <= params <= MAX_PARAMS:
        raise ConfigRefused(f"the checkpoint declares {params} parameters, outside 1 to {MAX_PARAMS}")
    theta = c.get("rope_theta", 10000.0)
    eps = c.get("rms_norm_eps", 1e-5)
    return DeclaredModel(
        name, arch,  # type: ignore[arg-type]  # one of SUPPORTED's values, the Architecture literal
        hidden_size=hidden, num_layers=_int(c, "num_hidden_layers", _MAX_LAYERS), num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=_int(c, "intermediate_size", _MAX_DIM),
        vocab_size=_int(c, "vocab_size", _MAX_VOCAB), tie_embeddings=tie is True,
        attention_bias=arch == "qwen2" or c.get("attention_bias") is True,
        rope_theta=float(theta) if isinstance(theta, int | float) and not isinstance(theta, bool) else 10000.0,
        max_position=_int(c, "max_position_embeddings", 1 << 24, default=4096),
        rms_norm_eps=float(eps) if isinstance(eps, int | float) and not isinstance(eps, bool) else 1e-5,
        default_targets=FUSED_ATTENTION if arch == "phi3" else ATTENTION, params=params, note="from the Hub's config.json")


def _attention_shape(c: dict[str, Any]) -> tuple[int, int, int, int]:
    """hidden_size, num_attention_heads, num_key_value_heads (a divisor of the heads) and head_dim (at least 1)."""
    hidden = _int(c, "hidden_size", _MAX_DIM)
    heads = _int(c, "num_attention_heads", _MAX_DIM)
    kv_heads = _int(c, "num_key_value_heads", heads, default=heads)
    if heads % kv_heads:
        raise ConfigRefused(f"config.json's num_attention_heads {heads} is not a multiple of num_key_value_heads "
                            f"{kv_heads}")
    head_dim = c.get("head_dim")
    head_dim = _int(c, "head_dim", _MAX_DIM) if head_dim is not None else hidden // heads
    if head_dim < 1:
        raise ConfigRefused("config.json's hidden_size is smaller than num_attention_heads")
    return hidden, heads, kv_heads, head_dim


def dtype_of(config: dict[str, Any]) -> str:
    """The checkpoint's dtype as config.json names it ("bfloat16" when it does not)."""
    value = config.get("torch_dtype", config.get("dtype"))
    return value if isinstance(value, str) and value in DTYPE_BYTES else "bfloat16"


def params_from_index(index: Any, dtype: str) -> int:
    """model.safetensors.index.json's metadata.total_size (bytes) over the dtype's width; 0 when absent."""
    meta = index.get("metadata") if isinstance(index, dict) else None
    total = meta.get("total_size") if isinstance(meta, dict) else None
    if isinstance(total, bool) or not isinstance(total, int | float) or total <= 0:
        return 0
    return int(total) // DTYPE_BYTES.get(dtype, 2)


def params_from_header(header: Any) -> int:
    """The sum of every tensor's element count in a safetensors header; 0 when it is not one."""
    if not isinstance(header, dict):
        return 0
    total = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            return 0
        n = 1
        for d in shape:
            n *= d
        total += n
    return total
