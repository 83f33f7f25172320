"""The agent's configuration: the environment it starts with, TENSORANT_BOOTSTRAP decoded over it.

The variables themselves are described in the agent's --help (machine.agent.main).
"""

from __future__ import annotations

import base64
import json
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

BOOTSTRAP_VAR = "TENSORANT_BOOTSTRAP"


def default_trainer_command() -> str:
    return f"{shlex.quote(sys.executable)} -m machine.trainer.smoke"


class BootstrapError(ValueError):
    """TENSORANT_BOOTSTRAP is not base64 of a JSON object of strings. The message never holds the value."""


def overlay_bootstrap(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with TENSORANT_BOOTSTRAP decoded and laid over it (and itself removed).

    One variable carries the whole bootstrap so that no value can break the env file it
    is written to (base64 has no line breaks). Its values hold the run token and presigned
    URLs, so errors say what is wrong with it, never what it holds.
    """
    out = dict(env)
    raw = out.pop(BOOTSTRAP_VAR, None)
    if raw is None:
        return out
    try:
        text = base64.b64decode(raw.strip(), validate=True).decode("utf-8")
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
        raise BootstrapError(f"agent: {BOOTSTRAP_VAR} is not base64 of UTF-8 text") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise BootstrapError(f"agent: {BOOTSTRAP_VAR} does not decode to JSON") from None
    if not isinstance(data, dict):
        raise BootstrapError(f"agent: {BOOTSTRAP_VAR} must decode to a JSON object, not {type(data).__name__}")
    bad = sorted(k for k, v in data.items() if not isinstance(v, str))
    if bad:
        raise BootstrapError(f"agent: {BOOTSTRAP_VAR} values must be strings; {', '.join(bad[:10])} are not")
    out.update(data)
    return out


def _seconds(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key) or ""
    try:
        value = float(raw) if raw.strip() else default
    except ValueError:
        raise ValueError(f"agent: {key} must be a number of seconds") from None
    if value < 0 or value != value:
        raise ValueError(f"agent: {key} must be a number of seconds, not negative")
    return value


# What the restart exchange hands an agent whose machine was started again, and the field each one sets: its
# storage access (what the machine got at launch may have expired while it was stopped).
CONTINUE_FIELDS = {
    "TENSORANT_STORAGE_DIR": "storage_dir", "TENSORANT_DATASET_KEY": "dataset_key",
    "TENSORANT_ADAPTER_KEY": "adapter_key", "TENSORANT_LOGS_KEY": "logs_key", "TENSORANT_MERGED_KEY": "merged_key",
    "TENSORANT_DATASET_URL": "dataset_url", "TENSORANT_ADAPTER_UPLOAD_URL": "adapter_upload_url",
    "TENSORANT_LOGS_UPLOAD_URL": "logs_upload_url", "TENSORANT_MERGED_UPLOAD_URL": "merged_upload_url",
    "TENSORANT_EVAL_DATASET_KEY": "eval_dataset_key", "TENSORANT_EVAL_DATASET_URL": "eval_dataset_url",
    "TENSORANT_CHECKPOINT_KEYS": "checkpoint_keys", "TENSORANT_CHECKPOINT_UPLOAD_URLS": "checkpoint_upload_urls",
}


# The org's metrics trackers (shared/services/api/org_secrets.py), for the trainer (machine/trainer/tracking.py).
TRACKING_SECRET_VARS = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY")


@dataclass(frozen=True)
class AgentConfig:
    run_id: str
    api_url: str
    token: str
    base_model: str
    data_dir: Path
    trainer_command: str
    heartbeat_interval_s: float = 30.0
    storage_dir: str = ""
    dataset_key: str = ""
    adapter_key: str = ""
    logs_key: str = ""
    dataset_url: str = ""
    adapter_upload_url: str = ""
    logs_upload_url: str = ""
    merged_key: str = ""  # training.merged: where merged.zip goes (a directory), or its presigned URL
    merged_upload_url: str = ""
    # The run's checkpoint slots (JSON lists): keys under storage_dir, or presigned PUT URLs.
    checkpoint_keys: str = ""
    checkpoint_upload_urls: str = ""
    # The run's validation dataset (validation_dataset_version_id): its key, or a presigned GET URL, and sha256.
    eval_dataset_key: str = ""
    eval_dataset_url: str = ""
    eval_dataset_sha256: str = ""
    base_model_path: str = ""  # a local directory holding the base model, for the trainer
    base_model_revision: str = ""  # a Hub model's pinned commit id, for the trainer
    training: str = ""  # the run's training settings (a JSON object), passed to the trainer as is
    dataset_sha256: str = ""  # what the control plane validated; a download that differs is refused
    hf_token: str = ""  # for gated base models; a secret
    # The org's metrics trackers (org secrets): in the trainer's environment as they came, masked in every line.
    tracking_secrets: tuple[str, ...] = ()
    complete_retry_s: float = 1800.0  # how long to keep trying to report completion
    heartbeat_retry_s: float = 20.0  # a heartbeat that cannot get through waits for the next one
    # Self-protection (machine.agent.guard): the bounds past which the agent stops training and powers
    # its machine off by itself, when the control plane that should have done it is gone or wrong.
    runtime_limit_s: float = 0.0  # the run's runtime limit; 0 = unknown
    deadline_at: float = 0.0  # the run's runtime deadline at launch (epoch seconds); 0 = unknown
    self_stop_margin_s: float = 1800.0  # past either of the above by this much
    unreachable_stop_s: float = 3600.0  # no heartbeat got through for this long
    gone_grace_s: float = 900.0  # the control plane answered 404/410 for the run for this long
    poweroff: str = ""  # how the machine powers off: "exit" (the host script), "runpod" (the pod's API), "" none

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AgentConfig:
        missing = [k for k in ("TENSORANT_RUN_ID", "TENSORANT_API_URL", "TENSORANT_RUN_TOKEN") if not env.get(k)]
        if missing:
            raise ValueError(f"agent: missing environment {', '.join(missing)}")
        return cls(
            run_id=env["TENSORANT_RUN_ID"],
            api_url=env["TENSORANT_API_URL"].rstrip("/"),
            token=env["TENSORANT_RUN_TOKEN"],
            base_model=env.get("TENSORANT_BASE_MODEL", ""),
            data_dir=Path(env.get("TENSORANT_DATA_DIR") or "/workspace/data"),
            trainer_command=env.get("TENSORANT_TRAINER_COMMAND") or default_trainer_command(),
            heartbeat_interval_s=float(env.get("TENSORANT_HEARTBEAT_INTERVAL_S") or 30),
            storage_dir=env.get("TENSORANT_STORAGE_DIR", ""),
            dataset_key=env.get("TENSORANT_DATASET_KEY", ""),
            adapter_key=env.get("TENSORANT_ADAPTER_KEY", ""),
            logs_key=env.get("TENSORANT_LOGS_KEY", ""),
            dataset_url=env.get("TENSORANT_DATASET_URL", ""),
            adapter_upload_url=env.get("TENSORANT_ADAPTER_UPLOAD_URL", ""),
            logs_upload_url=env.get("TENSORANT_LOGS_UPLOAD_URL", ""),
            merged_key=env.get("TENSORANT_MERGED_KEY", ""),
            merged_upload_url=env.get("TENSORANT_MERGED_UPLOAD_URL", ""),
            checkpoint_keys=env.get("TENSORANT_CHECKPOINT_KEYS", ""),
            checkpoint_upload_urls=env.get("TENSORANT_CHECKPOINT_UPLOAD_URLS", ""),
            eval_dataset_key=env.get("TENSORANT_EVAL_DATASET_KEY", ""),
            eval_dataset_url=env.get("TENSORANT_EVAL_DATASET_URL", ""),
            eval_dataset_sha256=env.get("TENSORANT_EVAL_DATASET_SHA256", "").lower(),
            base_model_path=env.get("TENSORANT_BASE_MODEL_PATH", ""),
            base_model_revision=env.get("TENSORANT_BASE_MODEL_REVISION", ""),
            training=env.get("TENSORANT_TRAINING", ""),
            dataset_sha256=env.get("TENSORANT_DATASET_SHA256", "").lower(),
            hf_token=env.get("HF_TOKEN", ""),
            tracking_secrets=tuple(env[k] for k in TRACKING_SECRET_VARS if env.get(k)),
            complete_retry_s=float(env.get("TENSORANT_COMPLETE_RETRY_S") or 1800),
            runtime_limit_s=_seconds(env, "TENSORANT_RUNTIME_LIMIT_S", 0),
            deadline_at=_seconds(env, "TENSORANT_DEADLINE_AT", 0),
            self_stop_margin_s=_seconds(env, "TENSORANT_SELF_STOP_MARGIN_S", 1800),
            unreachable_stop_s=_seconds(env, "TENSORANT_UNREACHABLE_STOP_S", 3600),
            gone_grace_s=_seconds(env, "TENSORANT_GONE_GRACE_S", 900),
            poweroff=env.get("TENSORANT_POWEROFF", "").strip().lower(),
        )

    def continued(self, bootstrap: str) -> AgentConfig:
        """This configuration with what a restart exchange handed over (base64 of a JSON object, as
        TENSORANT_BOOTSTRAP): its storage access; nothing else (the run, the API, the data directory, the
        trainer, the bounds) can change. BootstrapError when it does not decode."""
        fresh = overlay_bootstrap({BOOTSTRAP_VAR: bootstrap})
        values: dict[str, Any] = {field: fresh[key] for key, field in CONTINUE_FIELDS.items() if key in fresh}
        return replace(self, **values)

    def secrets(self) -> list[str]:
        try:
            slots = json.loads(self.checkpoint_upload_urls) if self.checkpoint_upload_urls else []
        except ValueError:
            slots = []
        slot_urls = [str(u) for u in slots] if isinstance(slots, list) else []
        return [s for s in (self.token, self.dataset_url, self.adapter_upload_url, self.logs_upload_url,
                            self.merged_upload_url, self.hf_token, self.eval_dataset_url, self.checkpoint_upload_urls,
                            *slot_urls, *self.tracking_secrets) if s]
