"""The agent's side of training.merged (machine/agent/uploads.py): the trainer's output/merged folder exported
as merged.zip through the run's own key, only its model files, never through a link; a missing or unsafe folder
is logged and left out (the adapter is the run's product)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from machine.agent.config import AgentConfig
from machine.agent.uploads import Uploads


def uploads(tmp_path: Path, logged: list[str], merged_key: str = "") -> Uploads:
    cfg = AgentConfig(run_id="run-m", api_url="http://127.0.0.1:9", token="t", base_model="tensorant/tiny-llama",
                      data_dir=tmp_path / "data", trainer_command="true", storage_dir=str(tmp_path / "storage"),
                      adapter_key="runs/run-m/adapter.zip", merged_key=merged_key)
    (tmp_path / "data").mkdir(exist_ok=True)
    return Uploads(cfg, logged.append, output=tmp_path / "out", logs_path=tmp_path / "data" / "logs.txt")


def merged_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "out" / "merged"
    folder.mkdir(parents=True)
    for name in ("config.json", "manifest.json", "model-00001-of-00002.safetensors",
                 "model-00002-of-00002.safetensors", "model.safetensors.index.json", "trainer_state.pt", "notes.txt"):
        (folder / name).write_bytes(name.encode())
    return folder


def test_the_merged_folder_is_exported_with_only_its_model_files(tmp_path: Path) -> None:
    merged_folder(tmp_path)
    logged: list[str] = []
    got = uploads(tmp_path, logged, merged_key="runs/run-m/merged.zip").export_merged()
    stored = tmp_path / "storage" / "runs" / "run-m" / "merged.zip"
    assert got["merged_size"] == stored.stat().st_size and len(str(got["merged_sha256"])) == 64
    with zipfile.ZipFile(stored) as z:
        assert sorted(z.namelist()) == ["config.json", "manifest.json", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors", "model.safetensors.index.json"]


def test_no_merged_model_is_asked_made_or_safe_to_read(tmp_path: Path) -> None:
    logged: list[str] = []
    assert uploads(tmp_path, logged).export_merged() == {}  # not asked: no key, no URL
    assert uploads(tmp_path, logged, merged_key="runs/run-m/merged.zip").export_merged() == {}
    assert "the trainer wrote no merged model" in logged[-1]
    folder = merged_folder(tmp_path)
    secret = tmp_path / "data" / "agent-state.json"
    secret.write_text('{"token": "t"}')
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(secret)  # the trainer pointing the export at the agent's state
    assert uploads(tmp_path, logged, merged_key="runs/run-m/merged.zip").export_merged() == {}
    assert "could not export the merged model" in logged[-1] and "a link" in logged[-1]
    assert not (tmp_path / "storage" / "runs" / "run-m" / "merged.zip").exists()
