"""A DPO run end to end on the local provider with the REAL trainer (issue 43.2): pairs uploaded
through the API, a run with training.method dpo launched, trained by machine.trainer.lora on the
tiny Llama, its adapter verified, and its held-out preference accuracy on the run's eval curve."""

from __future__ import annotations

import json

import pytest

from tests.e2e.local_host import TERMINAL_OR_RETAINED, Client, local_training_setup

pytestmark = pytest.mark.e2e
BASE = "tensorant/tiny-llama"


@pytest.fixture(autouse=True)
def real_trainer(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORANT_TRAINER_COMMAND")
    monkeypatch.setenv("TENSORANT_TORCH_THREADS", "1")


def test_a_dpo_run_succeeds_with_its_preference_curve(api: Client) -> None:
    setup = local_training_setup(api, "dpo", BASE)
    rows = [json.dumps({"prompt": f"What is {i} plus {i}?", "chosen": f"{i} plus {i} is {2 * i}.",
                        "rejected": f"I do not know what {i} plus {i} is."}) for i in range(24)]
    pairs = api("POST", f"/api/projects/{setup.project_id}/datasets", data="\n".join(rows).encode(),
                headers={"Content-Type": "application/x-ndjson"})
    assert pairs["format"] == "pairs"
    run = api("POST", "/api/runs", json={
        "project_id": setup.project_id, "dataset_version_id": pairs["id"], "provider": "local",
        "offer_id": setup.offer["offer_id"], "base_model": BASE, "price_limit_per_hour": 1.0,
        "training": {"method": "dpo", "dpo_beta": 0.1, "max_steps": 4, "batch_size": 4, "max_seq_len": 64,
                     "learning_rate": 0.005, "sample_prompts": 1, "eval_every_steps": 2}})
    api("POST", f"/api/runs/{run['id']}/launch", json={"confirm": True})
    done = api.wait(f"/api/runs/{run['id']}", lambda x: x["state"] in TERMINAL_OR_RETAINED, timeout=150)
    lines = api("GET", f"/api/runs/{run['id']}/logs")["lines"]
    assert done["state"] == "succeeded", (done["reason"], lines[-30:])
    metrics = api("GET", f"/api/runs/{run['id']}/metrics")
    assert [p["step"] for p in metrics["eval_points"]] == [2, 4], metrics
    assert all(0.0 <= p["preference_accuracy"] <= 1.0 and "reward_margin" in p for p in metrics["eval_points"])
