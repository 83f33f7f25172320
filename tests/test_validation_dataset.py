"""A run's validation dataset (issue 42.4): validation_dataset_version_id is checked at create and edit like the
training set, handed to the agent with its sha256, downloaded beside the dataset and passed to the trainer as
TENSORANT_EVAL_DATASET_PATH (tests/trainer/test_validation_dataset.py: the trainer evaluates on it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from machine.agent.agent import Agent
from machine.agent.config import AgentConfig
from machine.agent.state import Failed
from machine.agent.uploads import VALIDATION_FILE
from tests.harness import ApiError, Harness


def _dataset(harness: Harness, project_id: str, rows: int) -> str:
    lines = [json.dumps({"prompt": f"p{i}", "completion": f"c{i}"}) for i in range(rows)]
    ds = harness.ok("POST", f"/api/projects/{project_id}/datasets", body="\n".join(lines).encode(),
              content_type="application/x-ndjson")
    return str(ds["id"])


def _create(harness: Harness, project: tuple[str, str], validation: str | None) -> Any:
    pid, dsid = project
    return harness.ok("POST", "/api/runs", token="member", json_body={
        "project_id": pid, "dataset_version_id": dsid, "provider": "memory", "offer_id": "mem-a10",
        "base_model": "tensorant/smoke-tiny", "price_limit_per_hour": 100.0, "runtime_limit_s": 3600,
        **({"validation_dataset_version_id": validation} if validation is not None else {})})


def _refused(harness: Harness, project: tuple[str, str], validation: str) -> str:
    with pytest.raises(ApiError) as e:
        _create(harness, project, validation)
    assert e.value.status == 422, e.value.body
    text = json.dumps(e.value.body)
    assert "validation_dataset_version_id" in text
    return text


def test_checked_at_create_like_the_training_set(harness: Harness) -> None:
    project = harness.project_and_dataset()
    other_project = harness.project_and_dataset()
    assert "another project" in _refused(harness, project, other_project[1])
    assert "is the training dataset version" in _refused(harness, project, project[1])
    assert "no dataset version" in _refused(harness, project, "ds-nope")
    assert "validation_dataset_version_id" in _refused(harness, project, "../x")

    valid = _dataset(harness, project[0], 5)
    run = _create(harness, project, valid)
    assert run["validation_dataset_version_id"] == valid

    # An edit is checked the same way; "" drops it.
    with pytest.raises(ApiError) as e:
        harness.ok("PATCH", f"/api/runs/{run['id']}", json_body={"validation_dataset_version_id": other_project[1]})
    assert e.value.status == 422 and "another project" in json.dumps(e.value.body)
    assert harness.get_run(run["id"])["validation_dataset_version_id"] == valid  # the refused edit changed nothing
    edited = harness.ok("PATCH", f"/api/runs/{run['id']}", json_body={"validation_dataset_version_id": ""})
    assert edited["validation_dataset_version_id"] == ""


def test_launch_hands_the_agent_the_validation_set_and_its_sha256(harness: Harness) -> None:
    from shared.services.steps.launch import storage_access
    from shared.store import get_store

    project = harness.project_and_dataset()
    valid = _dataset(harness, project[0], 4)
    run_id = _create(harness, project, valid)["id"]
    store = get_store()
    run, _ = store.runs.get(harness.org, run_id)
    record = store.datasets.get(harness.org, valid)
    env, _ = storage_access(harness.ctx, run, store.datasets.get(harness.org, project[1]), 3600)
    assert env["TENSORANT_EVAL_DATASET_SHA256"] == record.sha256
    assert env.get("TENSORANT_EVAL_DATASET_KEY", record.storage_key) == record.storage_key
    assert "TENSORANT_EVAL_DATASET_KEY" in env or "TENSORANT_EVAL_DATASET_URL" in env

    without = _create(harness, project, None)["id"]
    run, _ = store.runs.get(harness.org, without)
    env, _ = storage_access(harness.ctx, run, store.datasets.get(harness.org, project[1]), 3600)
    assert not {k for k in env if k.startswith("TENSORANT_EVAL_DATASET")}


def _agent(tmp_path: Path, eval_sha: str) -> Agent:
    storage = tmp_path / "storage"
    (storage / "datasets").mkdir(parents=True)
    (storage / "datasets" / "d1.jsonl").write_text('{"text": "a"}\n')
    (storage / "datasets" / "v1.jsonl").write_text('{"text": "held"}\n')
    (tmp_path / "data").mkdir()
    return Agent(AgentConfig(run_id="run-v", api_url="http://127.0.0.1:9", token="t", base_model="tensorant/smoke-tiny",
                             data_dir=tmp_path / "data", trainer_command="true", storage_dir=str(storage),
                             dataset_key="datasets/d1.jsonl", eval_dataset_key="datasets/v1.jsonl",
                             eval_dataset_sha256=eval_sha), environ={})


def test_the_agent_downloads_it_checked_and_hands_it_to_the_trainer(tmp_path: Path) -> None:
    sha = hashlib.sha256(b'{"text": "held"}\n').hexdigest()
    agent = _agent(tmp_path, sha)
    dataset = agent.uploads.fetch_dataset()
    assert (tmp_path / "data" / VALIDATION_FILE).read_text() == '{"text": "held"}\n'
    env = agent.trainer_env(dataset, tmp_path / "out")
    assert env["TENSORANT_EVAL_DATASET_PATH"] == str(tmp_path / "data" / VALIDATION_FILE)


def test_the_agent_refuses_a_changed_validation_set(tmp_path: Path) -> None:
    agent = _agent(tmp_path, "0" * 64)
    with pytest.raises(Failed) as e:
        agent.uploads.fetch_dataset()
    assert "validation dataset is not the validated one" in str(e.value)
