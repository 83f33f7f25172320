"""What the agent keeps of a run: its progress on the data disk, and a step's failure to report.

AgentState survives restarts (a RunPod resume, a VM reboot) so a finished or stopped phase
is never run again; Failed carries what the failure report (POST complete) says.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_FILE = "agent-state.json"


class Failed(Exception):
    def __init__(self, reason: str, exit_code: int | None = None, *, output_exists: bool | None = None,
                 stage: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code
        self.output_exists = output_exists  # None: look at the output directory
        self.stage = stage  # what failed, for the run's reason: dataset, training, export, upload


class AgentState:
    """The agent's progress on the persistent data directory (DATA_DIR/agent-state.json).

    A RunPod resume or a VM restart starts the agent again on the same disk: what it reached
    decides what it does, so that training is never run twice over output that may be the
    only copy. Fields: run_id, phase (preparing, training, trained, exporting, exported),
    trainer_exit, adapter_sha256, adapter_size, completion (the body to send), completion_sent,
    stopped + stop_reason, token (the latest renewed one), continue_with (the storage access a restart
    exchange handed over, laid over the launch's at every start).
    Written atomically (temporary file, fsync, rename), mode 0600: it holds the token.
    """

    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError):
            loaded = None
        if isinstance(loaded, dict):
            if "completed" in loaded and "completion" not in loaded:  # the earlier format
                loaded = {"completion": loaded["completed"], "completion_sent": True}
            if loaded.get("run_id", run_id) == run_id:
                self.data = loaded
        self.data["run_id"] = run_id

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def update(self, **values: Any) -> None:
        self.data.update(values)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.data, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
