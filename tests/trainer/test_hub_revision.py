"""A base model named by Hub id: the trainer loads the commit the control plane pinned
(TENSORANT_BASE_MODEL_REVISION), and Phi-3's fused modules are what LoRA adapts, with the shapes
adapter_format.hub_config derives from its config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import need_torch

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "a"}]}) + "\n")
    return {"TENSORANT_OUTPUT_DIR": str(tmp_path / "out"), "TENSORANT_DATASET_PATH": str(data),
            "TENSORANT_BASE_MODEL": "acme/llama-fork", **more}


def test_the_pinned_revision_reaches_from_pretrained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_torch()
    import transformers

    from machine.trainer import lora

    job = lora.read_job(_env(tmp_path, TENSORANT_BASE_MODEL_REVISION=COMMIT))
    assert isinstance(job, lora.Job) and job.revision == COMMIT
    seen: list[dict[str, Any]] = []

    def record(source: str, **kwargs: Any) -> Any:
        seen.append({"source": source, **kwargs})
        raise OSError("no hub here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", record)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", record)
    assert lora.load_base(job, "fp32", False) == 3  # no such model here: exit 3, after asking for the commit
    assert seen and all(s["revision"] == COMMIT and s["source"] == "acme/llama-fork" for s in seen)
    unpinned = lora.read_job(_env(tmp_path))
    assert isinstance(unpinned, lora.Job) and unpinned.revision is None


def test_phi3_lora_targets_its_fused_modules_at_the_derived_shapes() -> None:
    need_torch()
    import transformers

    from adapter_format.hub_config import model_from_config
    from machine.trainer import lora
    from machine.trainer.config import parse_settings

    config: dict[str, Any] = {"architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
              "max_position_embeddings": 128, "pad_token_id": 0}
    derived = model_from_config("acme/tiny-phi3", config)
    model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**{k: v for k, v in config.items()
                                                                    if k != "architectures"}))
    assert sum(p.numel() for p in model.parameters()) == derived.param_count()
    s, _ = parse_settings(json.dumps({"target_modules": "all-linear", "lora_r": 4}))
    peft_model, _, _, targets = lora.add_lora(model, s, cuda=False)  # chooses the fused names by model_type
    assert targets == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    shapes = {name: tuple(p.shape) for name, p in peft_model.named_parameters() if "lora_" in name}
    for module, (n_in, n_out) in derived.modules.items():
        a = shapes[f"base_model.model.model.layers.1.{'self_attn' if module in ('qkv_proj', 'o_proj') else 'mlp'}"
                   f".{module}.lora_A.default.weight"]
        assert a == (4, n_in)
        b = shapes[f"base_model.model.model.layers.1.{'self_attn' if module in ('qkv_proj', 'o_proj') else 'mlp'}"
                   f".{module}.lora_B.default.weight"]
        assert b == (n_out, 4)
