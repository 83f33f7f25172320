"""training.merged: the adapter folded into its base model's weights on the machine (machine/trainer/merge.py),
exported by the agent (machine/agent/uploads.py) and verified like the adapter (adapter_format/merged.py)."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from adapter_format.base_models import BASE_MODELS
from adapter_format.merged import expected_tensors, verify_merged
from tests.trainer.conftest import TINY, need_torch, pirate_rows, trainer_env, write_jsonl


def lora_adapter(base_dir: Path, out: Path, **config: Any) -> Any:
    """A LoRA adapter of base_dir with random (non-zero) lora_B, saved to out as the trainer saves one."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **config))
    with torch.no_grad():
        for name, q in model.named_parameters():
            if "lora_B" in name or "magnitude" in name:
                q.add_(torch.randn_like(q) * 0.1)
    model.save_pretrained(str(out))
    return model


def zipped(folder: Path, tmp: Path) -> bytes:
    """folder as the agent exports it (merged_names + zip_folder)."""
    from machine.agent.uploads import merged_names, zip_folder

    zip_folder(folder, tmp / "merged.zip", merged_names(folder))
    return (tmp / "merged.zip").read_bytes()


def test_merged_weights_are_base_plus_scaled_lora(tiny_model: Path, tmp_path: Path) -> None:
    need_torch()
    from safetensors.torch import load_file

    from machine.trainer.merge import merge_into_output

    lora_adapter(tiny_model, tmp_path)
    assert merge_into_output(str(tiny_model), tmp_path, TINY, device="cpu", token=None)
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    base = load_file(tiny_model / "model.safetensors")
    adapter = load_file(tmp_path / "adapter_model.safetensors")
    at = "model.layers.1.self_attn.q_proj"
    a, b = adapter[f"base_model.model.{at}.lora_A.weight"], adapter[f"base_model.model.{at}.lora_B.weight"]
    want = base[f"{at}.weight"] + (b @ a) * (8 / 4)
    assert float((merged[f"{at}.weight"] - want).abs().max()) < 1e-6
    assert float((merged[f"{at}.weight"] - base[f"{at}.weight"]).abs().max()) > 1e-3  # the adapter did change it
    # Untargeted weights are the base's, bit for bit; the dtype is the base's.
    assert merged["model.layers.1.self_attn.k_proj.weight"].equal(base["model.layers.1.self_attn.k_proj.weight"])
    assert {t.dtype for t in merged.values()} == {base[f"{at}.weight"].dtype}
    manifest = json.loads((tmp_path / "merged" / "manifest.json").read_text())
    assert manifest["base_model"] == TINY and set(manifest["files"]) == {"config.json", "generation_config.json",
                                                                         "model.safetensors"}
    result = verify_merged(zipped(tmp_path / "merged", tmp_path), base_model=TINY, expected_sha256=None)
    assert result.ok, result.problems
    assert result.summary["tensors"] == len(expected_tensors(BASE_MODELS[TINY]))


def test_dora_merged_into_sharded_qwen2_answers_as_base_plus_adapter(tmp_path: Path) -> None:
    need_torch()
    import torch
    from transformers import AutoModelForCausalLM

    from machine.trainer import merge
    from machine.trainer.random_model import build_random_model

    base_dir = build_random_model("tensorant/tiny-qwen2", tmp_path / "base")  # q/k/v biases, tied embeddings
    adapted = lora_adapter(base_dir, tmp_path / "out", use_dora=True).eval()
    merge.MAX_SHARD_SIZE = "60KB"  # several shards and an index, as a large model gets
    try:
        assert merge.merge_into_output(str(base_dir), tmp_path / "out", "tensorant/tiny-qwen2", device="cpu",
                                       token=None)
    finally:
        merge.MAX_SHARD_SIZE = "2GB"
    folder = tmp_path / "out" / "merged"
    assert (folder / "model.safetensors.index.json").exists() and len(list(folder.glob("model-*"))) > 1
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        want = adapted(input_ids=ids).logits
        got = AutoModelForCausalLM.from_pretrained(folder).eval()(input_ids=ids).logits
    assert float((got - want).abs().max()) < 1e-4
    result = verify_merged(zipped(folder, tmp_path), base_model="tensorant/tiny-qwen2", expected_sha256=None)
    assert result.ok, result.problems
    assert result.summary["shards"] > 1


@pytest.fixture(scope="module")
def good(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a good merged folder of the tiny model."""
    need_torch()
    from machine.trainer.merge import merge_into_output

    out = tmp_path_factory.mktemp("merged")
    lora_adapter(tiny_model, out)
    assert merge_into_output(str(tiny_model), out, TINY, device="cpu", token=None)
    return {p.name: p.read_bytes() for p in (out / "merged").iterdir()}


def archive(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def safetensors_with(data: bytes, change: Any) -> bytes:
    """The safetensors file with its tensors changed by change(dict of name -> tensor)."""
    from safetensors.torch import load, save

    tensors = load(data)
    change(tensors)
    return save(tensors)


def refused(files: dict[str, bytes], fragment: str, **kw: Any) -> None:
    result = verify_merged(archive(files), base_model=kw.pop("base_model", TINY), expected_sha256=kw.pop("sha", None))
    assert not result.ok and any(fragment in p for p in result.problems), result.problems


def test_the_verifier_refuses_what_is_not_the_base_models_merged_weights(good: dict[str, bytes]) -> None:
    import torch

    assert verify_merged(archive(good), base_model=TINY, expected_sha256=None).ok
    weights = good["model.safetensors"]

    def nan(t: dict[str, Any]) -> None:
        t["model.norm.weight"][0] = float("nan")

    def reshaped(t: dict[str, Any]) -> None:
        t["model.layers.0.mlp.up_proj.weight"] = torch.zeros(64, 128)

    def extra(t: dict[str, Any]) -> None:
        t["model.layers.0.self_attn.q_proj.lora_A.weight"] = torch.zeros(4, 64)

    def missing(t: dict[str, Any]) -> None:
        del t["model.layers.1.mlp.down_proj.weight"]

    refused({**good, "model.safetensors": safetensors_with(weights, nan)}, "NaN or infinite")
    refused({**good, "model.safetensors": safetensors_with(weights, reshaped)}, "has shape [64, 128]")
    refused({**good, "model.safetensors": safetensors_with(weights, extra)}, "does not have")
    refused({**good, "model.safetensors": safetensors_with(weights, missing)}, "lack 1 of")
    refused({**good, "run.sh": b"#!/bin/sh\n"}, "is not part of a merged model")
    refused({**good, "../model.safetensors": weights}, "climbs out")
    refused({k: v for k, v in good.items() if k != "config.json"}, "no config.json")
    config = json.loads(good["config.json"])
    refused({**good, "config.json": json.dumps({**config, "hidden_size": 128}).encode()}, "hidden_size = 128")
    refused({**good, "model-00001-of-00002.safetensors": weights}, "must be model.safetensors or every shard")
    refused(good, "not the " + "0" * 64, sha="0" * 64)
    refused(good, "Llama-3.1-8B-Instruct has 4096", base_model="meta-llama/Llama-3.1-8B-Instruct")
    # A file changed after the trainer listed it in the manifest.
    refused({**good, "generation_config.json": b"{}"}, "does not match the sha256")


def test_a_trainer_run_with_merged_writes_the_verified_merged_model(tiny_model: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    need_torch()
    import gc

    from transformers import PreTrainedModel

    from machine.trainer import merge
    from machine.trainer.lora import train

    alive: list[int] = []
    real = merge.merge_into_output

    def counting(*args: Any, **kw: Any) -> bool:
        # The training model must be gone before the base model is loaded again (the GPU holds one copy).
        gc.collect()
        alive.append(sum(isinstance(o, PreTrainedModel) for o in gc.get_objects()))
        return real(*args, **kw)

    monkeypatch.setattr(merge, "merge_into_output", counting)
    data = write_jsonl(tmp_path / "data.jsonl", pirate_rows(12))
    settings = {"max_steps": 2, "batch_size": 4, "lora_r": 4, "max_seq_len": 48, "sample_prompts": 0, "merged": True,
                "neftune_alpha": 5.0}
    assert train(trainer_env(tiny_model, data, tmp_path / "out", settings)) == 0
    assert alive == [0]
    assert "merging the adapter into" in capsys.readouterr().out
    result = verify_merged(zipped(tmp_path / "out" / "merged", tmp_path), base_model=TINY, expected_sha256=None)
    assert result.ok, result.problems
    assert not (tmp_path / "out" / ".merged.partial").exists()


def test_the_api_and_the_trainer_declare_the_same_settings() -> None:
    """Every TENSORANT_TRAINING field on both sides of the contract, with the same default (merged included)."""
    from machine.trainer.config import TrainerSettings, parse_settings
    from shared.models import TrainingSettings

    api = TrainingSettings()
    assert {f.name for f in fields(TrainerSettings)} == set(TrainingSettings.model_fields)
    defaults = TrainerSettings()
    assert {f.name: getattr(defaults, f.name) for f in fields(TrainerSettings) if f.name != "kind"} == {
        name: getattr(api, name) for name in TrainingSettings.model_fields if name != "kind"}
    assert parse_settings('{"merged": true}')[0].merged is True
    with pytest.raises(ValueError, match="merged"):
        parse_settings('{"merged": "yes"}')
    with pytest.raises(ValueError, match="merged"):
        TrainingSettings.model_validate({"merged": "true"})
