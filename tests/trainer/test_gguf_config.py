"""A model converted from GGUF is saved as a plain model: no `quantization_config: {quant_method: gguf}`
left in its config.json (HF Trainer refuses to fine-tune a model that declares one). Needs no GGUF
file and no torch: the cleanup works on the saved directory."""

from __future__ import annotations

import json
from pathlib import Path

from machine.trainer.gguf_models import clear_quantization_config, ensure_local_model, model_dir

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
# What transformers 5 writes after loading SmolLM2 from its GGUF, trimmed.
CONVERTED = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
             "quantization_config": {"quant_method": "gguf"}, "vocab_size": 49152}


def test_the_saved_config_declares_no_quantization(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONVERTED))
    assert clear_quantization_config(tmp_path) is True
    config = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config == {k: v for k, v in CONVERTED.items() if k != "quantization_config"}
    assert clear_quantization_config(tmp_path) is False  # idempotent


def test_a_directory_converted_before_is_repaired_on_use(tmp_path: Path) -> None:
    target = model_dir(MODEL, tmp_path)
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps(CONVERTED))
    (target / ".tensorant-converted").write_text("converted from x.gguf\n")
    assert ensure_local_model(MODEL, tmp_path) == target  # cached: no GGUF needed
    assert "quantization_config" not in json.loads((target / "config.json").read_text())
