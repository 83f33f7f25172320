"""Each training setting of the third pass changes training as documented (machine/trainer/config.py), on the
tiny model in this process (`lora.train`, the trainer's whole path without a subprocess's imports):
evaluation during training with early stopping and the best adapter kept, a chat template and
train_on_inputs, DoRA and rsLoRA, NEFTune, the scheduler, warmup steps, the optimizer and weight decay.
Each is checked against a baseline run that differs only in that setting."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from machine.trainer.config import SettingsError, parse_settings
from tests.trainer.conftest import need_torch, pirate_rows, trainer_env, write_jsonl

BASE = {"max_steps": 8, "learning_rate": 0.01, "batch_size": 4, "lora_r": 4, "lora_alpha": 8, "max_seq_len": 48,
        "warmup_ratio": 0.0, "lora_dropout": 0.0, "sample_prompts": 0, "seed": 3, "eval_fraction": 0.2}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("settings") / "data.jsonl", pirate_rows(40))


def train(tiny_model: Path, dataset: Path, out: Path, capsys: pytest.CaptureFixture[str],
          **changes: Any) -> tuple[dict[str, Any], str]:
    """(manifest, printed log) of one in-process run with BASE updated by changes."""
    need_torch()
    from machine.trainer.lora import train as run_trainer

    code = run_trainer(trainer_env(tiny_model, dataset, out, {**BASE, **changes}))
    log = capsys.readouterr().out
    assert code == 0, log[-3000:]
    return json.loads((out / "manifest.json").read_text()), log


def weights(out: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(out / "adapter_model.safetensors")


def lrs(log: str) -> list[float]:
    return [float(dict(kv.split("=") for kv in line.split())["lr"]) for line in log.splitlines()
            if line.startswith("progress=")]


@pytest.fixture(scope="module")
def baseline(tiny_model: Path, dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    need_torch()
    from machine.trainer.lora import train as run_trainer

    out = tmp_path_factory.mktemp("baseline")
    assert run_trainer(trainer_env(tiny_model, dataset, out, BASE)) == 0
    return json.loads((out / "manifest.json").read_text()), out


def test_settings_are_validated() -> None:
    for raw, field in [('{"eval_every_steps": 0}', "eval_every_steps"), ('{"optimizer": "adam"}', "optimizer"),
                       ('{"lr_scheduler": "step"}', "lr_scheduler"), ('{"neftune_alpha": 0}', "neftune_alpha"),
                       ('{"weight_decay": 2}', "weight_decay"), ('{"use_dora": "yes"}', "use_dora"),
                       ('{"chat_template": "vicuna"}', "chat_template"),
                       ('{"early_stopping_patience": 2}', "early_stopping_patience")]:
        with pytest.raises(SettingsError, match=field):
            parse_settings(raw)
    s, _ = parse_settings('{"eval_every_steps": 2, "early_stopping_patience": 1, "chat_template": "chatml"}')
    assert s.eval_every_steps == 2 and s.keep_best and s.chat_template == "chatml"


def test_the_api_validates_the_same_settings() -> None:
    from pydantic import ValidationError

    from shared.models import TrainingSettings

    for bad in [{"eval_every_steps": 0}, {"optimizer": "adam"}, {"lr_scheduler": "step"}, {"neftune_alpha": 0},
                {"weight_decay": 2.0}, {"chat_template": "vicuna"}, {"early_stopping_patience": 2},
                {"warmup_steps": -1}, {"use_rslora": "true"}]:
        with pytest.raises(ValidationError):
            TrainingSettings.model_validate(bad)
    good = {"eval_every_steps": 2, "early_stopping_patience": 1, "early_stopping_threshold": 0.01, "keep_best": False,
            "chat_template": "llama3", "train_on_inputs": True, "use_dora": True, "use_rslora": True,
            "neftune_alpha": 5.0, "lr_scheduler": "linear", "warmup_steps": 3, "optimizer": "sgd", "weight_decay": 0.1}
    dumped = TrainingSettings.model_validate(good).model_dump(mode="json")
    # What the control plane stores is what the trainer accepts, field for field.
    s, warnings = parse_settings(json.dumps({k: v for k, v in dumped.items() if v is not None}))
    assert not warnings and all(getattr(s, k) == v for k, v in good.items())


def test_eval_curve_early_stopping_and_best_adapter_kept(tiny_model: Path, dataset: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         baseline: tuple[dict[str, Any], Path]) -> None:
    # A learning rate this high overshoots: the best evaluation is not the last one.
    m, log = train(tiny_model, dataset, tmp_path / "a", capsys, max_steps=12, learning_rate=0.01,
                   eval_every_steps=2)
    steps = [int(s) for s, _ in m["eval_curve"]]
    assert steps == [2, 4, 6, 8, 10, 12], m["eval_curve"]
    assert log.count("eval step=") == 6 and m["steps_done"] == 12 and m["stopped_early_at"] is None
    best = min(loss for _, loss in m["eval_curve"])
    assert m["eval_loss"] == pytest.approx(best, abs=1e-4)  # the adapter written is the best evaluation's
    assert m["best_step"] == steps[[loss for _, loss in m["eval_curve"]].index(best)]
    # Early stopping: no evaluation can improve by 10 nats, so it stops after `patience` of them.
    m2, log2 = train(tiny_model, dataset, tmp_path / "b", capsys, max_steps=12, eval_every_steps=2,
                     early_stopping_patience=2, early_stopping_threshold=10.0)
    assert m2["stopped_early_at"] == 6 and m2["steps_done"] == 6 and len(m2["loss"]) == 6, m2["eval_curve"]
    assert "early stopping at step 6 of 12" in log2
    assert baseline[0]["eval_curve"] == [] and baseline[0]["best_step"] is None


def test_keep_best_restores_an_earlier_adapter(tiny_model: Path) -> None:
    need_torch()
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from machine.trainer.config import TrainerSettings
    from machine.trainer.lora import ATTENTION, Progress, Run, keep_best, lora_config, trainable_state

    for keep in (True, False):
        s = TrainerSettings(keep_best=keep, eval_every_steps=1)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), lora_config(s, ATTENTION))
        best = trainable_state(model)
        with torch.no_grad():  # training went on past the best evaluation
            for q in model.parameters():
                if q.requires_grad:
                    q.add_(1.0)
        job: Any = type("Job", (), {"s": s})()
        run = Run(job=job, model=model, optimizer=None, scheduler=None, device=torch.device("cpu"), cuda=False,
                  pad_id=0, batching="packed", targets=ATTENTION, total_steps=2)
        p = Progress(evals=[[1, 0.5], [2, 0.9]], best=0.5, best_step=1, best_state=best, steps_done=2)
        kept = keep_best(run, p)
        restored = all(torch.equal(q.detach(), best[n]) for n, q in model.named_parameters() if q.requires_grad)
        # keep_best: the best adapter and its loss; without: the last step's, whose loss is the last evaluation.
        assert (kept, restored) == ((0.5, True) if keep else (0.9, False))


def test_chat_template_and_train_on_inputs(tiny_model: Path, dataset: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           baseline: tuple[dict[str, Any], Path]) -> None:
    # The tiny model's own template is ChatML: llama3's headers are other tokens around every turn.
    m, _ = train(tiny_model, dataset, tmp_path / "llama3", capsys, chat_template="llama3", sample_prompts=3)
    assert any("<|start_header_id|>user<|end_header_id|>\n\n" in sample["prompt"] for sample in m["samples"])
    assert m["settings"]["chat_template"] == "llama3"
    assert m["tokens"] != baseline[0]["tokens"]  # other text around every turn: other tokens
    inputs, _ = train(tiny_model, dataset, tmp_path / "inputs", capsys, train_on_inputs=True)
    # Every token but each example's first is learned: prompts, system turns and markers too.
    assert inputs["tokens"] == baseline[0]["tokens"]
    assert inputs["trained_tokens"] == inputs["tokens"] - BASE["max_steps"] * BASE["batch_size"]
    assert inputs["trained_tokens"] > baseline[0]["trained_tokens"] * 1.3
    # The held-out loss is still the assistant's: comparable with the baseline's before training.
    assert inputs["eval_loss_before"] == pytest.approx(baseline[0]["eval_loss_before"], abs=1e-6)
    bad = trainer_env(tiny_model, dataset, tmp_path / "bad", {**BASE, "chat_template": "{{ messages[0]['role'] }}"})
    from machine.trainer.lora import train as run_trainer

    assert run_trainer(bad) == 2
    assert "leaves out or alters the content" in capsys.readouterr().out


def test_dora_and_rslora(tiny_model: Path, dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                         baseline: tuple[dict[str, Any], Path]) -> None:
    from adapter_format.verify import verify_adapter
    from tests.support.adapters import zip_files
    from tests.trainer.conftest import TINY

    m, _ = train(tiny_model, dataset, tmp_path / "dora", capsys, use_dora=True)
    tensors = weights(tmp_path / "dora")
    magnitudes = [k for k in tensors if "lora_magnitude_vector" in k]
    assert magnitudes and m["trainable_params"] > baseline[0]["trainable_params"]
    config = json.loads((tmp_path / "dora" / "adapter_config.json").read_text())
    assert config["use_dora"] is True
    files = {n: (tmp_path / "dora" / n).read_bytes()
             for n in ("adapter_config.json", "adapter_model.safetensors", "manifest.json")}
    verdict = verify_adapter(zip_files(files), base_model=TINY, expected_sha256=None, provider="local",
                             smoke_allowed_on=("local",))
    assert verdict.ok, verdict.problems

    r, _ = train(tiny_model, dataset, tmp_path / "rslora", capsys, use_rslora=True, lora_r=16, lora_alpha=8)
    plain, _ = train(tiny_model, dataset, tmp_path / "plain16", capsys, lora_r=16, lora_alpha=8)
    assert json.loads((tmp_path / "rslora" / "adapter_config.json").read_text())["use_rslora"] is True
    # alpha / sqrt(r) = 2 against alpha / r = 0.5: the same init, four times the update's weight in the forward.
    assert r["loss"][0] == pytest.approx(plain["loss"][0], abs=1e-5)  # lora_B starts at zero either way
    assert r["loss"][1:] != plain["loss"][1:]


def test_rslora_scaling(tiny_model: Path) -> None:
    need_torch()
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from machine.trainer.config import TrainerSettings
    from machine.trainer.lora import ATTENTION, lora_config

    for rs, want in ((True, 8 / math.sqrt(16)), (False, 8 / 16)):
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                               lora_config(TrainerSettings(lora_r=16, lora_alpha=8, use_rslora=rs), ATTENTION))
        q = model.base_model.model.model.layers[0].self_attn.q_proj
        assert q.scaling["default"] == pytest.approx(want)


def test_neftune_noise(tiny_model: Path, dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       baseline: tuple[dict[str, Any], Path]) -> None:
    import torch

    from machine.trainer.gpu import Neftune

    m, log = train(tiny_model, dataset, tmp_path / "neft", capsys, neftune_alpha=5.0)
    assert "neftune_alpha=5.0" in log
    assert m["loss"] != baseline[0]["loss"]  # noise in the forward: another loss from the first step
    assert m["eval_loss_before"] == baseline[0]["eval_loss_before"]  # none in evaluation
    # The noise's scale is alpha / sqrt(L x d) with L each example's own length, padded or packed.
    emb = torch.nn.Embedding(10, 4)
    n = Neftune(8.0)
    n.attach(type("M", (), {"get_input_embeddings": lambda self: emb})())
    ids = torch.zeros((1, 20), dtype=torch.long)
    n.set_inputs({"input_ids": ids, "example_starts": torch.tensor([0, 4, 20])})
    noise = emb(ids) - emb.weight[0]
    assert noise[0, :4].abs().max() <= 8 / math.sqrt(4 * 4) + 1e-6 and noise[0, :4].abs().max() > 8 / math.sqrt(16 * 4)
    assert noise[0, 4:].abs().max() <= 8 / math.sqrt(16 * 4) + 1e-6
    emb.eval()
    assert torch.equal(emb(ids), emb.weight[ids])


def test_scheduler_warmup_optimizer_weight_decay(tiny_model: Path, dataset: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 baseline: tuple[dict[str, Any], Path]) -> None:
    lr = BASE["learning_rate"]
    _, constant = train(tiny_model, dataset, tmp_path / "c", capsys, lr_scheduler="constant", warmup_steps=2)
    assert lrs(constant) == pytest.approx([lr / 2, lr] + [lr] * 6)  # after each step: warmup over 2, then flat
    _, linear = train(tiny_model, dataset, tmp_path / "l", capsys, lr_scheduler="linear")
    assert lrs(linear) == pytest.approx([lr * (8 - k) / 8 for k in range(1, 9)], rel=1e-3)
    _, cosine = train(tiny_model, dataset, tmp_path / "cos", capsys)
    assert lrs(cosine) == pytest.approx([lr * 0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(1, 9)], rel=1e-3)
    sgd, _ = train(tiny_model, dataset, tmp_path / "sgd", capsys, optimizer="sgd")
    assert sgd["loss"][0] == pytest.approx(baseline[0]["loss"][0], abs=1e-6) and sgd["loss"][1:] != baseline[0]["loss"][1:]
    train(tiny_model, dataset, tmp_path / "wd", capsys, weight_decay=0.5)
    # Decoupled decay pulls every trained weight toward zero: lora_A, which starts random, ends smaller.
    decayed, plain = weights(tmp_path / "wd"), weights(baseline[1])
    a_norm = sum(float(v.norm()) for k, v in decayed.items() if "lora_A" in k)
    assert a_norm < sum(float(v.norm()) for k, v in plain.items() if "lora_A" in k)
    env = trainer_env(tiny_model, dataset, tmp_path / "8bit", {**BASE, "optimizer": "adamw_8bit"})
    from machine.trainer.lora import train as run_trainer

    assert run_trainer(env) == 2 and "adamw_8bit needs a CUDA GPU" in capsys.readouterr().out


def test_packed_attention_flex_is_refused_on_the_cpu(tiny_model: Path, dataset: Path, tmp_path: Path,
                                                     baseline: tuple[dict[str, Any], Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    need_torch()
    from pydantic import ValidationError

    from machine.trainer.batches import SEGMENTS
    from machine.trainer.lora import train as run_trainer
    from shared.models import TrainingSettings

    with pytest.raises(ValidationError, match="packed_attention"):
        TrainingSettings.model_validate({"packed_attention": "flash"})
    assert TrainingSettings.model_validate({"packed_attention": "flex"}).packed_attention == "flex"
    code = run_trainer(trainer_env(tiny_model, dataset, tmp_path / "out", {**BASE, "packed_attention": "flex"}))
    assert code == 2
    assert "training.packed_attention flex needs a CUDA GPU" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()
    # The CPU's default: packed rows, attention per example (segment_attention), named in the manifest.
    manifest, _ = baseline
    assert manifest["batching"] == "packed" and manifest["attention"] == SEGMENTS
