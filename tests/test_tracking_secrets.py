"""Metrics trackers as org secrets (issue 42.5): an owner saves an MLflow tracking server (and token) or a W&B key;
write-only, sealed, owner-only, handed to the machine's environment for the trainer and never shown or logged."""

from __future__ import annotations

import json
import logging

import pytest

from tests.fakes import Cloud, draft
from tests.harness import Harness

MLFLOW_TOKEN = "mlflow-DoNotLeak-0123456789"
MLFLOW_URI = "https://mlflow.example.com/team-a"
WANDB_KEY = "a" * 20 + "DoNotLeakWandbKey0123"


def test_trackers_are_write_only_owner_only_and_reach_only_the_machine(
        harness: Harness, cloud: Cloud, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    status, _, _ = harness.call("PUT", "/api/org/secrets/mlflow", token="member", json_body={"tracking_uri": MLFLOW_URI})
    assert status == 403
    for bad, field in (({"tracking_uri": "file:///etc/passwd"}, "tracking_uri"),
                       ({"tracking_uri": MLFLOW_URI, "token": "has space inside"}, "token"),
                       ({"tracking_uri": MLFLOW_URI, "surprise": 1}, "surprise")):
        status, body, _ = harness.call("PUT", "/api/org/secrets/mlflow", json_body=bad)
        assert status == 422 and field in json.dumps(body), body
    status, body, _ = harness.call("PUT", "/api/org/secrets/wandb", json_body={"api_key": "short"})
    assert status == 422 and "api_key" in json.dumps(body)

    saved = harness.ok("PUT", "/api/org/secrets/mlflow", json_body={"tracking_uri": MLFLOW_URI, "token": MLFLOW_TOKEN,
                                                               "experiment": "pirates"})
    assert saved["mlflow"] == {"set": True} and saved["wandb"] == {"set": False}
    shown = harness.ok("PUT", "/api/org/secrets/wandb", json_body={"api_key": WANDB_KEY})
    assert shown["wandb"] == {"set": True}
    from shared.store import get_store

    rec = get_store().secrets.get(harness.org, "mlflow")
    assert rec is not None and MLFLOW_TOKEN not in rec.model_dump_json() and MLFLOW_URI not in rec.model_dump_json()

    _, run = draft(harness)
    launched = harness.launch(run["id"])
    (machine,) = cloud.machines.values()
    assert (machine.env["MLFLOW_TRACKING_URI"], machine.env["MLFLOW_TRACKING_TOKEN"]) == (MLFLOW_URI, MLFLOW_TOKEN)
    assert machine.env["MLFLOW_EXPERIMENT_NAME"] == "pirates" and machine.env["WANDB_API_KEY"] == WANDB_KEY
    everything = json.dumps([saved, shown, launched, harness.get_run(run["id"])]) + caplog.text
    assert MLFLOW_TOKEN not in everything and WANDB_KEY not in everything

    assert harness.call("DELETE", "/api/org/secrets/mlflow")[0] == 204
    assert harness.ok("GET", "/api/org/secrets")["mlflow"] == {"set": False}


def test_the_agent_masks_the_trackers_and_hands_them_to_the_trainer(tmp_path: object) -> None:
    from pathlib import Path

    from machine.agent.agent import Agent
    from machine.agent.config import AgentConfig

    data = Path(str(tmp_path)) / "data"
    data.mkdir()
    environ = {"TENSORANT_RUN_ID": "r", "TENSORANT_API_URL": "http://127.0.0.1:9", "TENSORANT_RUN_TOKEN": "t",
               "TENSORANT_DATA_DIR": str(data), "MLFLOW_TRACKING_URI": MLFLOW_URI,
               "MLFLOW_TRACKING_TOKEN": MLFLOW_TOKEN, "WANDB_API_KEY": WANDB_KEY}
    config = AgentConfig.from_env(environ)
    assert {MLFLOW_URI, MLFLOW_TOKEN, WANDB_KEY} <= set(config.secrets())
    env = Agent(config, environ=environ).trainer_env(data / "dataset.jsonl", data / "out")
    assert (env["MLFLOW_TRACKING_TOKEN"], env["WANDB_API_KEY"]) == (MLFLOW_TOKEN, WANDB_KEY)


def test_names_are_not_secrets(harness: Harness) -> None:
    """The experiment and project names are not masked (the default "tensorant" would be, everywhere)."""
    from shared.log import redact_text

    harness.ok("PUT", "/api/org/secrets/wandb", json_body={"api_key": WANDB_KEY})
    harness.ok("PUT", "/api/org/secrets/mlflow", json_body={"tracking_uri": MLFLOW_URI, "experiment": "pirates"})
    assert redact_text("tensorant pirates") == "tensorant pirates"
    assert WANDB_KEY not in redact_text(f"key {WANDB_KEY}")
