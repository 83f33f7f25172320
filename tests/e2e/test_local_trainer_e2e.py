"""End to end with the REAL trainer: the local host serving the app on Azurite, the local provider
running the agent with its default trainer (shared/providers/local/trainer.py -> machine.trainer.lora)
on the declared tiny Llama (random weights built once in the local model cache), a verified
adapter, downloaded through the API and loaded with peft on that base model."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from tests.e2e.local_host import TERMINAL_OR_RETAINED, Client, local_training_setup

pytestmark = pytest.mark.e2e
BASE = "tensorant/tiny-llama"


@pytest.fixture(autouse=True)
def real_trainer(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The local provider's default trainer, the real one (`api` starts the host after this)."""
    monkeypatch.delenv("TENSORANT_TRAINER_COMMAND")
    monkeypatch.setenv("TENSORANT_TORCH_THREADS", "1")  # a tiny model on a shared CPU: one thread is fastest


def test_real_trainer_run_succeeds_and_the_downloaded_adapter_loads_with_peft(api: Client, tmp_path: Path) -> None:
    import requests

    setup = local_training_setup(api, "real", BASE)
    assert "real LoRA trainer" in setup.checks["trainer"]["message"]
    assert setup.offer["fits"] is True
    run = api("POST", "/api/runs", json={
        "project_id": setup.project_id, "dataset_version_id": setup.dataset_id, "provider": "local",
        "offer_id": setup.offer["offer_id"], "base_model": BASE, "price_limit_per_hour": 1.0,
        "training": {"max_steps": 4, "batch_size": 4, "max_seq_len": 64, "learning_rate": 0.005,
                     "sample_prompts": 1}})
    r = requests.get(f"{api.url}/api/runs/{run['id']}/adapter", headers=dict(api.s.headers), timeout=10)
    assert r.status_code == 409
    api("POST", f"/api/runs/{run['id']}/launch", json={"confirm": True})
    done = api.wait(f"/api/runs/{run['id']}", lambda x: x["state"] in TERMINAL_OR_RETAINED, timeout=120)
    lines = api("GET", f"/api/runs/{run['id']}/logs")["lines"]
    assert done["state"] == "succeeded", (done["reason"], lines[-30:])
    assert any("trainer: lora kind=trial" in line for line in lines), lines
    assert any(line.startswith("progress=") and "loss=" in line for line in lines), lines

    r = requests.get(f"{api.url}/api/runs/{run['id']}/adapter", headers=dict(api.s.headers), timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/zip"
    assert r.headers["X-Adapter-Sha256"] == hashlib.sha256(r.content).hexdigest() == done["adapter_sha256"]
    # The CLI saves the same bytes.
    from tensorant_cli.main import main as cli

    token = api.s.headers["Authorization"].removeprefix("Bearer ")
    saved = tmp_path / "cli-adapter.zip"
    assert cli(["--url", api.url, "--token", token, "runs", "download", run["id"], "-o", str(saved)]) == 0
    assert saved.read_bytes() == r.content
    out = tmp_path / "adapter"
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        z.extractall(out)
    adapter_dir = next(p.parent for p in out.rglob("adapter_config.json"))
    manifest = json.loads(next(out.rglob("manifest.json")).read_text())
    assert (manifest["trainer"], manifest["base_model"], manifest["kind"]) == ("lora", BASE, "trial")
    # The forecast is checked against the trainer's own figures; its error is printed for the record.
    check = done["forecast_check"]
    assert (check["training_s"], check["tokens"], check["steps"]) == (manifest["train_seconds"], manifest["tokens"], 4)
    assert check["training_error"] == round(done["forecast"]["training_s"] / manifest["train_seconds"] - 1, 4)
    print(f"forecast check ({BASE}, local CPU): {check}")

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from shared import settings

    base_dir = Path(settings.get_settings().local_root) / "models" / BASE.replace("/", "--")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and all(float(p.abs().sum()) > 0 for p in lora_b)  # trained: every lora_B moved off zero
