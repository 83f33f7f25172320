"""Declared base models: parameter counts equal the real architectures built on the meta device,
and the memory estimate behaves (4-bit < bf16; logits dominate small models)."""

from __future__ import annotations

import pytest

from adapter_format.base_models import BASE_MODELS, GiB, get_base_model
from tests.support.adapters import lora_shapes

REAL = {  # published sizes, a sanity check on the shapes themselves
    "HuggingFaceTB/SmolLM2-135M-Instruct": 134_515_008,
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
    "mistralai/Mistral-7B-Instruct-v0.3": 7_248_023_552,
}


@pytest.mark.parametrize("name", sorted(BASE_MODELS))
def test_param_count_matches_the_architecture(name: str) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    spec = BASE_MODELS[name]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(spec.hf_config())
    assert model.config.model_type == spec.architecture
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()
    layer = model.model.layers[0]
    for module, (n_in, n_out) in spec.modules.items():
        linear = getattr(layer.self_attn, module, None) or getattr(layer.mlp, module)
        assert (linear.in_features, linear.out_features) == (n_in, n_out), module
    if name in REAL:
        assert spec.param_count() == REAL[name]


def test_memory_estimates() -> None:
    qwen = get_base_model("Qwen/Qwen2.5-0.5B-Instruct")
    llama = get_base_model("meta-llama/Llama-3.1-8B-Instruct")
    assert qwen is not None and llama is not None
    # 0.5B: the full 151,936-entry logits would be 4 x 1024 tokens x 12 bytes = 7 GiB, more than the
    # 1 GB of weights; the chunked loss keeps one chunk of at most 2**25 logits (384 MiB) alive.
    assert 2 * GiB < qwen.estimate_memory() < 4 * GiB
    assert qwen.estimate_memory(batch_size=1, seq_len=512) < qwen.estimate_memory()
    longer = qwen.estimate_memory(batch_size=1, seq_len=8192) - qwen.estimate_memory(batch_size=1, seq_len=1024)
    assert 0 < longer < GiB  # activations only: the logits term stays at one chunk
    bf16 = llama.estimate_memory(batch_size=1, seq_len=1024)
    four = llama.estimate_memory(batch_size=1, seq_len=1024, load_in_4bit=True)
    assert 16 * GiB < bf16 < 24 * GiB and 5 * GiB < four < 11 * GiB  # torchtune / LLaMA-Factory: 16-30, 6-10
    assert llama.estimate_memory(gradient_checkpointing=False) > llama.estimate_memory()
    assert llama.lora_params(16, llama.targets("all-linear")) > llama.lora_params(16, llama.targets("attention"))
    d = llama.describe(batch_size=1, seq_len=1024)
    assert d["q_dim"] == 4096 and d["kv_dim"] == 1024 and d["memory_gb_4bit"] < d["memory_gb_bf16"]
    tiny = get_base_model("tensorant/tiny-llama")
    assert tiny is not None and tiny.q_dim == 128 != tiny.hidden_size
    assert lora_shapes(tiny, 4, ["o_proj"]) == {"o_proj": ((4, 128), (64, 4))}
