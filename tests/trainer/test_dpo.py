"""DPO on the tiny random Llama (issue 43.2): a short run raises the chosen-over-rejected margin on
its training pairs, only the answer's tokens are scored, the reference is the adapter disabled, and the
real trainer (`python -m machine.trainer.lora`, method dpo) writes an adapter the verifier accepts with
held-out preference accuracy and reward margin in its eval lines and manifest."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path
from typing import Any

import pytest

from adapter_format.verify import verify_adapter
from tests.trainer.conftest import TINY, need_torch, run_trainer, start_trainer, trainer_env, write_jsonl


def pair_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Pirate answers preferred over plain ones; every other row in the chat shape."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        chosen, rejected = f"Arr, {a} + {b} be {a + b}, matey!", f"The sum is {a + b}."
        if i % 2:
            rows.append({"messages": [{"role": "user", "content": f"What is {a} + {b}?"}],
                         "chosen": {"role": "assistant", "content": chosen},
                         "rejected": {"role": "assistant", "content": rejected}})
        else:
            rows.append({"prompt": f"What is {a} + {b}?", "chosen": chosen, "rejected": rejected})
    return rows


def _tokenizer_and_model(tiny_model: Path) -> tuple[Any, Any]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj"],
                        task_type="CAUSAL_LM")
    return tokenizer, get_peft_model(model, config)


def test_only_the_answer_is_scored_and_the_reference_is_the_base(tiny_model: Path) -> None:
    need_torch()
    import torch

    from machine.trainer import dpo
    from machine.trainer.data import IGNORE, normalise

    tokenizer, model = _tokenizer_and_model(tiny_model)
    pair = dpo.encode_pair(tokenizer, normalise(pair_rows(2)[1], 1), 64)
    for side, answer in ((pair.chosen, "Arr"), (pair.rejected, "The sum")):
        learned = [t for t, label in zip(side.input_ids, side.labels, strict=True) if label != IGNORE]
        assert learned and answer in tokenizer.decode(learned) and "What is" not in tokenizer.decode(learned)
    # Only the answers' positions through lm_head: the same log-probabilities as the full logits'.
    from machine.trainer.batches import collate_padded

    inputs = collate_padded([pair.chosen, pair.rejected], 0, torch.device("cpu"))
    for mean in (False, True):
        fast, full = dpo.sequence_logps(model, inputs, mean), dpo.full_sequence_logps(model, inputs, mean)
        assert torch.allclose(fast, full, atol=1e-5), (fast, full)
    # A fresh LoRA (B = 0) is the base: policy and reference agree, so the loss is log 2 and the rewards 0.
    losses, chosen, rejected = dpo.pair_losses(model, [pair], 0, torch.device("cpu"), 0.1, "sigmoid")
    assert float(losses[0].detach()) == pytest.approx(0.693147, abs=1e-5)
    assert float(chosen[0]) == pytest.approx(0.0, abs=1e-6) and float(rejected[0]) == pytest.approx(0.0, abs=1e-6)


def test_a_short_dpo_run_raises_the_chosen_over_rejected_margin(tiny_model: Path) -> None:
    need_torch()
    import torch

    from machine.trainer import dpo
    from machine.trainer.data import normalise

    tokenizer, model = _tokenizer_and_model(tiny_model)
    pairs = [dpo.encode_pair(tokenizer, normalise(r, i), 64) for i, r in enumerate(pair_rows(8))]
    cpu = torch.device("cpu")
    before = dpo.evaluate(model, pairs, 4, 0, cpu, 0.1, "sigmoid")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.01)
    model.train()
    for _ in range(6):
        for i in range(0, len(pairs), 4):
            losses, _, _ = dpo.pair_losses(model, pairs[i: i + 4], 0, cpu, 0.1, "sigmoid")
            losses.mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    after = dpo.evaluate(model, pairs, 4, 0, cpu, 0.1, "sigmoid")
    assert before is not None and after is not None
    assert after.margin > before.margin + 0.05, (before, after)
    assert after.loss < before.loss and after.accuracy > 0.5
    # ipo: the same machinery, its own loss (at a fresh adapter: (0 - 1 / (2 beta))^2 = 25 for beta 0.1).
    fresh = _tokenizer_and_model(tiny_model)[1]
    ipo = dpo.evaluate(fresh, pairs, 4, 0, cpu, 0.1, "ipo")
    assert ipo is not None and ipo.loss == pytest.approx(25.0, rel=1e-4)


SETTINGS = {"method": "dpo", "dpo_beta": 0.1, "max_steps": 6, "learning_rate": 0.01, "batch_size": 4, "lora_r": 4,
            "lora_alpha": 8, "max_seq_len": 48, "lora_dropout": 0.0, "sample_prompts": 1, "seed": 7, "kind": "trial",
            "eval_every_steps": 3, "checkpoint_every_steps": 3, "merged": True, "train_on_inputs": True}


def test_the_trainer_runs_dpo_and_reports_preference_metrics(tiny_model: Path, tmp_path: Path) -> None:
    need_torch()
    dataset = write_jsonl(tmp_path / "pairs.jsonl", pair_rows(24))
    out = tmp_path / "out"
    env = trainer_env(tiny_model, dataset, out, SETTINGS)
    env["TENSORANT_CHECKPOINT_DIR"] = str(tmp_path / "checkpoint")
    proc = start_trainer(env)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-4000:]
    assert "a DPO run scores the answers only" in log  # train_on_inputs is SFT's: said and ignored
    evals = [line for line in log.splitlines() if line.startswith("eval step=")]
    assert len(evals) == 2 and all("preference_accuracy=" in e and "reward_margin=" in e for e in evals), evals
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["method"] == "dpo" and manifest["batching"] == "padded"
    assert set(manifest["preference"]) == {"before", "after"}
    assert 0.0 <= manifest["preference"]["after"]["preference_accuracy"] <= 1.0
    assert manifest["eval_examples"] == 2 and manifest["train_examples"] == 22 and manifest["tokens"] > 0
    archive = tmp_path / "adapter.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in ("adapter_config.json", "adapter_model.safetensors", "manifest.json"):
            zf.writestr(name, (out / name).read_bytes())
    result = verify_adapter(archive.read_bytes(), base_model=TINY, expected_sha256=None)
    assert result.ok, result.problems
    # The merged model (SFT's code): written beside the adapter.
    assert (out / "merged").is_dir() and any((out / "merged").glob("*.safetensors")), log[-2000:]
    # Resumed from the step-3 checkpoint (SFT's code): the same adapter bytes as the uninterrupted run.
    env = trainer_env(tiny_model, dataset, tmp_path / "resumed", SETTINGS)
    env["TENSORANT_RESUME_FROM"] = str(tmp_path / "checkpoint" / "step-000003")
    proc = start_trainer(env)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "at step 4 of 6" in log, log[-4000:]
    assert (tmp_path / "resumed" / "adapter_model.safetensors").read_bytes() == \
        (out / "adapter_model.safetensors").read_bytes()
    # The method must match the data: sft on pairs (and dpo on examples) stops before training.
    wrong = run_trainer(tiny_model, dataset, tmp_path / "sft", {**SETTINGS, "method": "sft"})
    assert wrong.returncode == 2 and "set training.method to dpo" in wrong.stdout
