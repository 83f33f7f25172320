"""A run's validation dataset (issue 42.4, validation_dataset_version_id): the trainer evaluates on the rows of
TENSORANT_EVAL_DATASET_PATH, and every row of the training file trains (no fraction is held out of it)."""

from __future__ import annotations

import json
from pathlib import Path

from machine.trainer.config import parse_settings
from machine.trainer.lora import MAX_EVAL_EXAMPLES, eval_split
from tests.trainer.conftest import need_torch, pirate_rows, trainer_env, write_jsonl


def test_the_validation_rows_are_the_first_of_the_file_up_to_the_cap() -> None:
    s, _ = parse_settings(json.dumps({"eval_fraction": 0.5}))
    assert eval_split(7, s) == list(range(7))  # all of a small file, whatever eval_fraction says
    assert eval_split(MAX_EVAL_EXAMPLES + 50, s) == list(range(MAX_EVAL_EXAMPLES))


def test_the_trainer_evaluates_on_the_validation_file(tmp_path: Path, tiny_model: Path) -> None:
    import subprocess
    import sys

    need_torch()
    train = write_jsonl(tmp_path / "train.jsonl", pirate_rows(30))
    valid = write_jsonl(tmp_path / "valid.jsonl", pirate_rows(7, seed=9))
    env = trainer_env(tiny_model, train, tmp_path / "out", {
        "max_steps": 2, "batch_size": 4, "max_seq_len": 40, "lora_r": 4, "sample_prompts": 1, "eval_every_steps": 1})
    env["TENSORANT_EVAL_DATASET_PATH"] = str(valid)
    done = subprocess.run([sys.executable, "-m", "machine.trainer.lora"], env=env, cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    # 30 rows >= 20 would hold out 3 of them without a validation file (tests/trainer/test_lora.py).
    assert (manifest["rows"], manifest["train_examples"], manifest["eval_examples"]) == (30, 30, 7)
    assert manifest["eval_source"] == "validation_dataset"
    assert manifest["eval_loss_before"] is not None and manifest["eval_loss"] is not None
    log = done.stdout + done.stderr
    assert "evaluating on the validation dataset's 7 rows" in log and "eval step=1 eval_loss=" in log
