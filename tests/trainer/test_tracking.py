"""The trainer's metrics trackers (issue 42.5, machine/trainer/tracking.py): MLflow against a real `mlflow server`
on loopback (its run shows the parameters, the loss curve, the evaluations and the adapter's sha256), and nothing
imported or sent when no tracker is configured.

The server comes from the `mlflow` package, a test dependency only (never the app's or the trainer's: the trainer
speaks MLflow's REST API with the standard library): `make mlflow-venv` installs it in .tensorant/mlflow-venv,
else an `mlflow` on PATH is used, else the server test is skipped with that reason."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from machine.trainer import tracking

REPO = Path(__file__).resolve().parents[2]
SHA = "ab" * 32


def _mlflow() -> str | None:
    local = REPO / ".tensorant" / "mlflow-venv" / "bin" / "mlflow"
    return str(local) if local.is_file() else shutil.which("mlflow")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = _mlflow()
    if exe is None:
        pytest.skip("no mlflow server: run `make mlflow-venv` (installs PyPI mlflow in .tensorant/mlflow-venv)")
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    proc = subprocess.Popen([exe, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
                             "--default-artifact-root", str(root / "artifacts")],
                            stdout=subprocess.DEVNULL, stderr=(root / "server.log").open("wb"),
                            start_new_session=True)  # its workers are its session's: all ended below
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a cold start imports a lot on a busy CPU
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _get(url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/{path}", timeout=10) as r:
        return json.loads(r.read())


def test_mlflow_shows_the_runs_params_metrics_and_digest(mlflow_url: str) -> None:
    lines: list[str] = []
    env = {"MLFLOW_TRACKING_URI": mlflow_url, "MLFLOW_EXPERIMENT_NAME": "pirates"}
    losses = [2.5, 2.0, 1.5, 1.25]
    for _ in range(2):  # the experiment is created once and found the second time
        tracking.report(env, lines.append, run_name="run-abc", params={"lora_r": 4, "learning_rate": 0.005,
                                                                       "max_steps": None},
                        losses=losses, evals=[(2, 2.2), (4, 1.9)], summary={"eval_loss": 1.9, "eval_loss_before": 2.6},
                        adapter_sha256=SHA)
    assert all("metrics logged to MLflow" in line for line in lines), lines
    exp = _get(mlflow_url, "experiments/get-by-name?experiment_name=pirates")["experiment"]
    req = urllib.request.Request(f"{mlflow_url}/api/2.0/mlflow/runs/search", method="POST",
                                 data=json.dumps({"experiment_ids": [exp["experiment_id"]]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        runs = json.loads(r.read())["runs"]
    assert len(runs) == 2
    run = runs[0]
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == "run-abc"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params == {"lora_r": "4", "learning_rate": "0.005"}  # None (unset) is left out
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["tensorant.adapter_sha256"] == SHA
    rid = run["info"]["run_id"]
    history = _get(mlflow_url, f"metrics/get-history?run_id={rid}&metric_key=loss")["metrics"]
    assert [(m["step"], m["value"]) for m in sorted(history, key=lambda m: m["step"])] == [
        (1, 2.5), (2, 2.0), (3, 1.5), (4, 1.25)]
    evals = _get(mlflow_url, f"metrics/get-history?run_id={rid}&metric_key=eval_loss")["metrics"]
    assert sorted((m["step"], m["value"]) for m in evals) == [(0, 1.9), (2, 2.2), (4, 1.9)]


def test_a_refusing_server_costs_a_warning_not_the_training_and_never_the_token() -> None:
    lines: list[str] = []
    port = _free_port()  # nothing listens there
    tracking.report({"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}", "MLFLOW_TRACKING_TOKEN": "tok-secret-123"},
                    lines.append, run_name="r", params={}, losses=[1.0], evals=[], summary={}, adapter_sha256=SHA)
    assert len(lines) == 1 and "warning: could not log to MLflow" in lines[0] and "tok-secret-123" not in lines[0]


def test_nothing_is_imported_or_sent_without_a_tracker() -> None:
    code = ("import sys; from machine.trainer import tracking; "
            "tracking.report({}, print, run_name='r', params={}, losses=[1.0], evals=[], summary={}, adapter_sha256='x');"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('wandb', 'mlflow')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def _wandb_python() -> str | None:
    local = REPO / ".tensorant" / "wandb-venv" / "bin" / "python"
    return str(local) if local.is_file() else None


def test_wandb_offline_writes_the_run_and_sends_nothing(tmp_path: Path) -> None:
    """W&B in its offline mode: the run's files are written under WANDB_DIR and no connection is made (its API
    URL points at a loopback listener that must see nothing). wandb runs from its own venv (`make wandb-venv`),
    with the project on PYTHONPATH: tracking.py needs nothing else."""
    py = _wandb_python()
    if py is None:
        pytest.skip("no wandb: run `make wandb-venv` (installs PyPI wandb in .tensorant/wandb-venv)")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    code = ("from machine.trainer import tracking; "
            "tracking.report(__import__('os').environ, print, run_name='run-w', params={'lora_r': 4}, "
            "losses=[2.0, 1.5, 1.0], evals=[(2, 1.7)], summary={'eval_loss': 1.6}, adapter_sha256='" + SHA + "')")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path), "WANDB_MODE": "offline",
           "WANDB_DIR": str(tmp_path), "WANDB_API_KEY": "k" * 40, "WANDB_PROJECT": "pirates",
           "WANDB_BASE_URL": f"http://127.0.0.1:{listener.getsockname()[1]}", "WANDB_SILENT": "true"}
    out = subprocess.run([py, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and "metrics logged to Weights & Biases" in out.stdout, out.stdout + out.stderr
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wandb").iterdir())
    [records] = list(runs[0].glob("run-*.wandb"))
    data = records.read_bytes()
    assert SHA.encode() in data and b"eval_loss" in data and b"lora_r" in data
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing connected: offline sends nothing
    listener.close()
