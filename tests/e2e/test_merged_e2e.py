"""training.merged end to end with the REAL trainer on the local provider (tests/e2e/test_local_trainer_e2e.py's
setup): the machine merges the adapter into the tiny Llama's weights, the agent exports merged.zip beside
adapter.zip, the verify step verifies both, and GET /api/runs/{id}/adapter?format=merged (and the CLI's
`runs download --merged`) hands out a model that transformers loads and that answers as base + adapter."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.local_host import TERMINAL_OR_RETAINED, Client, LocalSetup, local_training_setup

pytestmark = pytest.mark.e2e
BASE = "tensorant/tiny-llama"


@pytest.fixture(autouse=True)
def real_trainer(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORANT_TRAINER_COMMAND")
    monkeypatch.setenv("TENSORANT_TORCH_THREADS", "1")


def run_to_end(api: Client, setup: LocalSetup, training: dict[str, Any]) -> dict[str, Any]:
    run = api("POST", "/api/runs", json={
        "project_id": setup.project_id, "dataset_version_id": setup.dataset_id, "provider": "local",
        "offer_id": setup.offer["offer_id"], "base_model": BASE, "price_limit_per_hour": 1.0, "training": training})
    api("POST", f"/api/runs/{run['id']}/launch", json={"confirm": True})
    done: dict[str, Any] = api.wait(f"/api/runs/{run['id']}", lambda x: x["state"] in TERMINAL_OR_RETAINED,
                                    timeout=180)
    assert done["state"] == "succeeded", (done["reason"], api("GET", f"/api/runs/{run['id']}/logs")["lines"][-30:])
    return done


def test_merged_model_is_verified_downloaded_and_answers_as_base_plus_adapter(api: Client, tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from shared import settings

    setup = local_training_setup(api, "merged", BASE)
    training: dict[str, Any] = {"max_steps": 4, "batch_size": 4, "max_seq_len": 64, "learning_rate": 0.01, "sample_prompts": 0}
    plain = run_to_end(api, setup, training)
    r = requests.get(f"{api.url}/api/runs/{plain['id']}/adapter?format=merged", headers=dict(api.s.headers), timeout=10)
    assert r.status_code == 404 and "not asked for" in r.json()["detail"]

    done = run_to_end(api, setup, {**training, "merged": True})
    assert done["merged_sha256"] and not done["merged_note"], done
    r = requests.get(f"{api.url}/api/runs/{done['id']}/adapter?format=merged", headers=dict(api.s.headers), timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/zip"
    assert r.headers["X-Adapter-Sha256"] == hashlib.sha256(r.content).hexdigest() == done["merged_sha256"]
    from tensorant_cli.main import main as cli

    token = api.s.headers["Authorization"].removeprefix("Bearer ")
    saved = tmp_path / "cli-merged.zip"
    assert cli(["--url", api.url, "--token", token, "runs", "download", str(done["id"]), "--merged",
                "-o", str(saved)]) == 0
    assert saved.read_bytes() == r.content
    adapter = requests.get(f"{api.url}/api/runs/{done['id']}/adapter", headers=dict(api.s.headers), timeout=30)
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        assert set(z.namelist()) == {"config.json", "generation_config.json", "manifest.json", "model.safetensors"}
        z.extractall(tmp_path / "merged")
    with zipfile.ZipFile(io.BytesIO(adapter.content)) as z:
        z.extractall(tmp_path / "adapter")

    base_dir = Path(settings.get_settings().local_root) / "models" / BASE.replace("/", "--")
    ids = torch.tensor([[3, 17, 42, 8, 99]])
    with torch.no_grad():
        want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir),
                                         tmp_path / "adapter").eval()(input_ids=ids).logits
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(base_dir).eval()(input_ids=ids).logits
    assert float((got - want).abs().max()) < 1e-4
    assert float((got - base).abs().max()) > 1e-4  # the adapter is in it: not the base model's answer
