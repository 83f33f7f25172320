"""The run's parameters, losses, evaluations and the adapter's digest sent where the team already looks: an
MLflow tracking server (MLFLOW_TRACKING_URI, optional MLFLOW_TRACKING_TOKEN) and/or Weights & Biases
(WANDB_API_KEY), both set only when the organization saved them (the org's sealed secrets; the agent hands them
to the trainer alone and masks them in every forwarded line).

MLflow is reached through its REST API (api/2.0/mlflow) with the standard library: nothing to install on the
machine. W&B needs its package; it is imported only when WANDB_API_KEY is set (WANDB_MODE=offline writes its
files and sends nothing). Tracking is best effort: a server that refuses or is down costs a warning line, never
the training; no token or key is ever printed."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

TIMEOUT_S = 20
MAX_BATCH = 900  # MLflow's log-batch takes at most 1000 metrics per call


def report(env: Mapping[str, str], log: Callable[[str], None], *, run_name: str, params: dict[str, Any],
           losses: list[float], evals: list[tuple[int, float]], summary: dict[str, float | None],
           adapter_sha256: str) -> None:
    """Send the run to every tracker the environment names (none: nothing is imported or sent)."""
    if env.get("MLFLOW_TRACKING_URI"):
        try:
            run_id = mlflow_report(env, run_name=run_name, params=params, losses=losses, evals=evals,
                                   summary=summary, adapter_sha256=adapter_sha256)
            log(f"trainer: metrics logged to MLflow (run {run_id})")
        except Exception as exc:  # best effort: the adapter is the run's product
            log(f"trainer: warning: could not log to MLflow: {_why(exc)}")
    if env.get("WANDB_API_KEY"):
        try:
            wandb_report(env, run_name=run_name, params=params, losses=losses, evals=evals, summary=summary,
                         adapter_sha256=adapter_sha256)
            log("trainer: metrics logged to Weights & Biases")
        except Exception as exc:
            log(f"trainer: warning: could not log to Weights & Biases: {_why(exc)}")


def _why(exc: Exception) -> str:
    # The type and the HTTP status only: a server's message might echo a header.
    code = getattr(exc, "code", None)
    return type(exc).__name__ + (f" (HTTP {code})" if code else "")


def _flat(params: dict[str, Any]) -> list[dict[str, str]]:
    return [{"key": k, "value": str(v)[:500]} for k, v in sorted(params.items()) if v is not None]


def mlflow_report(env: Mapping[str, str], *, run_name: str, params: dict[str, Any], losses: list[float],
                  evals: list[tuple[int, float]], summary: dict[str, float | None], adapter_sha256: str) -> str:
    call = _mlflow_client(env)
    exp_id = _mlflow_experiment(call, env.get("MLFLOW_EXPERIMENT_NAME") or "tensorant")
    now_ms = int(time.time() * 1000)
    run_id = call("POST", "runs/create", {"experiment_id": exp_id, "run_name": run_name, "start_time": now_ms,
                                          "tags": [{"key": "mlflow.runName", "value": run_name},
                                                   {"key": "tensorant.adapter_sha256", "value": adapter_sha256}]}
                  )["run"]["info"]["run_id"]
    metrics = [{"key": "loss", "value": float(v), "timestamp": now_ms, "step": i + 1} for i, v in enumerate(losses)]
    metrics += [{"key": "eval_loss", "value": float(v), "timestamp": now_ms, "step": int(s)} for s, v in evals]
    metrics += [{"key": k, "value": float(v), "timestamp": now_ms, "step": 0} for k, v in summary.items()
                if v is not None]
    flat = _flat(params)
    for i in range(0, max(len(metrics), len(flat), 1), MAX_BATCH):
        call("POST", "runs/log-batch", {"run_id": run_id, "metrics": metrics[i:i + MAX_BATCH],
                                        "params": flat[i:i + 100] if i == 0 else []})
    if len(flat) > 100:
        for j in range(100, len(flat), 100):
            call("POST", "runs/log-batch", {"run_id": run_id, "params": flat[j:j + 100]})
    call("POST", "runs/update", {"run_id": run_id, "status": "FINISHED", "end_time": int(time.time() * 1000)})
    return str(run_id)


def _mlflow_client(env: Mapping[str, str]) -> Callable[..., dict[str, Any]]:
    """call(method, path, body=None): one request to the MLflow REST API the environment names, its JSON answer."""
    base = env["MLFLOW_TRACKING_URI"].rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError("MLFLOW_TRACKING_URI must be an http(s) URL")
    headers = {"Content-Type": "application/json"}
    if env.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {env['MLFLOW_TRACKING_TOKEN']}"

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        req = urllib.request.Request(f"{base}/api/2.0/mlflow/{path}", method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            out: dict[str, Any] = json.loads(resp.read() or b"{}")
            return out

    return call


def _mlflow_experiment(call: Callable[..., dict[str, Any]], experiment: str) -> Any:
    """The experiment's id, the experiment created when the server has none of that name."""
    try:
        return call("GET", f"experiments/get-by-name?experiment_name={quote(experiment)}")["experiment"][
            "experiment_id"]
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        return call("POST", "experiments/create", {"name": experiment})["experiment_id"]


def wandb_report(env: Mapping[str, str], *, run_name: str, params: dict[str, Any], losses: list[float],
                 evals: list[tuple[int, float]], summary: dict[str, float | None], adapter_sha256: str) -> None:
    import wandb  # only here: a trainer without W&B configured never needs the package

    run = wandb.init(project=env.get("WANDB_PROJECT") or "tensorant", name=run_name, config=params,
                     mode=env.get("WANDB_MODE") or "online", reinit=True)
    try:
        for i, v in enumerate(losses):
            run.log({"loss": v}, step=i + 1)
        for s, v in evals:
            run.log({"eval_loss": v}, step=int(s))
        run.summary.update({**{k: v for k, v in summary.items() if v is not None}, "adapter_sha256": adapter_sha256})
    finally:
        run.finish()
