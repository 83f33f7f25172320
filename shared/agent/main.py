"""The agent: runs beside the trainer on the machine (cloud VM, RunPod pod or local process).

One code path everywhere. It reports to the control plane, runs the trainer, exports the
adapter and reports completion:

  heartbeat "preparing" -> fetch the dataset to DATA_DIR/dataset.jsonl
  -> heartbeat "training": run TENSORANT_TRAINER_COMMAND, stream its output, send the
     lines batched in heartbeats (every interval and at phase changes), progress from
     `progress=<0..1>` lines
  -> heartbeat "exporting": zip the output directory to the archive path, upload it
     and the logs -> POST complete {status: ok, sha256, size}
  A trainer that exits non-zero or writes no adapter -> POST complete {status: failed,
  output_exists, last_lines}: the control plane retains the machine only if output exists.

The archive path is DATA_DIR/adapter.zip, except with RunPod network storage on an AWS or
Azure host (presigned URLs plus the volume's keys): DATA_DIR/runs/<RUN_ID>/adapter.zip.

Afterwards it idles, sending nothing, until the control plane stops or deletes the
machine (SIGTERM exits). The data directory survives a retained machine, so the archive
can be recovered from it.

Restarts (a RunPod resume, a VM restart) start the agent again on the same data directory:
DATA_DIR/agent-state.json (written atomically) records the phase reached, the trainer's
exit, the adapter's sha256, the completion and whether it was sent, and a stop. A finished
or stopped phase is never run again and the output folder is never wiped: a stopped or
completed run idles, a finished trainer goes straight to export, a trainer interrupted
without a recorded stop is reported failed with its output kept. A heartbeat reply with
`stop: true` stops the trainer (SIGTERM, SIGKILL after TENSORANT_STOP_GRACE_S, 30), records
the stop and idles; a reply's `token` replaces the run token (tokens are short-lived).

Checkpoints (issue 19.3): the trainer gets TENSORANT_CHECKPOINT_DIR=DATA_DIR/checkpoint and
prints `checkpoint step=<k>` after each one it completes. The agent then uploads that
checkpoint's adapter files (its manifest says `checkpoint_step`) to the adapter's storage
key, at once rather than when stopped: a retained machine is stopped without warning (the
local provider freezes it, a lost heartbeat may mean it is dead), so `recover --verify-saved`
finds the last checkpoint in storage when no final adapter replaced it. A trainer stopped by a
`stop: true` reply while a checkpoint exists leaves the agent asking, every heartbeat interval,
whether to go on; a reply with `resume: true` (the owner's `recover --resume` moved the run back
to training) runs the trainer again with TENSORANT_RESUME_FROM=<the last checkpoint folder>.

Running as root with TENSORANT_TRAINER_USER set, the trainer runs as that user (its own
HOME, owning the output directory), so it cannot read the agent's environment or state.

Environment: TENSORANT_RUN_ID, TENSORANT_API_URL, TENSORANT_RUN_TOKEN (never printed),
TENSORANT_BASE_MODEL, TENSORANT_DATA_DIR (/workspace/data), TENSORANT_TRAINER_COMMAND
(default: the smoke trainer, `python -m shared.trainer.smoke`), TENSORANT_HEARTBEAT_INTERVAL_S
(30), and storage access: either TENSORANT_STORAGE_DIR with TENSORANT_DATASET_KEY /
TENSORANT_ADAPTER_KEY / TENSORANT_LOGS_KEY, or presigned TENSORANT_DATASET_URL (GET),
TENSORANT_ADAPTER_UPLOAD_URL (PUT) and TENSORANT_LOGS_UPLOAD_URL (PUT); TENSORANT_DATASET_SHA256,
when set, is the dataset's validated sha256: a download that differs fails the run.
On cloud machines all of it may come as one TENSORANT_BOOTSTRAP = base64(JSON object of
strings), decoded at start and laid over the environment (its values win).

The trainer gets TENSORANT_OUTPUT_DIR, TENSORANT_DATASET_PATH, TENSORANT_BASE_MODEL and,
when set, TENSORANT_BASE_MODEL_PATH, TENSORANT_TRAINING (JSON settings) and HF_TOKEN (a
secret: masked in every forwarded line), but never the run token or the storage URLs.

Only the standard library (urllib) and this package are imported, so the agent runs in
any image that has Python and these files (shared/__init__.py and shared/agent/).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from shared.agent.redact import redact_text, register_secret

MAX_LINES_PER_HEARTBEAT = 500  # the API's limit (shared.models.Heartbeat)
MAX_LINE_CHARS = 2000
MAX_PENDING_LINES = 5000
# Half the API's per-heartbeat limit on log bytes (shared.services.agent.MAX_HEARTBEAT_LOG_BYTES).
MAX_BYTES_PER_HEARTBEAT = 128 * 1024
REQUIRED_OUTPUT = ("adapter_config.json", "adapter_model.safetensors")
STATE_FILE = "agent-state.json"
CHECKPOINT_DIR = "checkpoint"  # under DATA_DIR: the trainer's step-<k> folders (shared.trainer.lora)
CHECKPOINT_ARCHIVE = "checkpoint-adapter.zip"  # adapter.zip on the disk stays the final adapter's name
# What of a checkpoint is uploaded: the adapter and its manifest; the optimizer state stays on the disk.
CHECKPOINT_EXPORT = ("adapter_config.json", "adapter_model.safetensors", "manifest.json")
_CHECKPOINT = re.compile(r"checkpoint step=(\d+)(?:\s|$)")
TAIL_LINES = 20  # the trainer lines a failure report carries
# `progress=<x>` opens a trainer's progress line; `step=.. loss=.. lr=..` may follow it.
_PROGRESS = re.compile(r"\s*progress=([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?:\s|$)")
BOOTSTRAP_VAR = "TENSORANT_BOOTSTRAP"
# Never handed to the trainer: it is the customer's (or our smoke) code and has no business
# talking to the control plane or storage. The bootstrap holds all of those at once.
_TRAINER_HIDDEN = ("TENSORANT_RUN_TOKEN", "TENSORANT_DATASET_URL", "TENSORANT_ADAPTER_UPLOAD_URL",
                   "TENSORANT_LOGS_UPLOAD_URL", BOOTSTRAP_VAR)


def default_trainer_command() -> str:
    return f"{shlex.quote(sys.executable)} -m shared.trainer.smoke"


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
    base_model_path: str = ""  # a local directory holding the base model, for the trainer
    training: str = ""  # the run's training settings (a JSON object), passed to the trainer as is
    dataset_sha256: str = ""  # what the control plane validated; a download that differs is refused
    hf_token: str = ""  # for gated base models; a secret
    complete_retry_s: float = 1800.0  # how long to keep trying to report completion
    heartbeat_retry_s: float = 20.0  # a heartbeat that cannot get through waits for the next one

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
            base_model_path=env.get("TENSORANT_BASE_MODEL_PATH", ""),
            training=env.get("TENSORANT_TRAINING", ""),
            dataset_sha256=env.get("TENSORANT_DATASET_SHA256", "").lower(),
            hf_token=env.get("HF_TOKEN", ""),
            complete_retry_s=float(env.get("TENSORANT_COMPLETE_RETRY_S") or 1800),
        )

    def secrets(self) -> list[str]:
        return [s for s in (self.token, self.dataset_url, self.adapter_upload_url, self.logs_upload_url,
                            self.hf_token) if s]


# ---------------------------------------------------------------- HTTP with retries


def _batches(lines: list[str]) -> list[list[str]]:
    """Heartbeat batches within the API's limits on lines and bytes (lines are capped already)."""
    out: list[list[str]] = []
    size = 0
    for line in lines:
        n = len(line.encode()) + 4
        if not out or len(out[-1]) >= MAX_LINES_PER_HEARTBEAT or size + n > MAX_BYTES_PER_HEARTBEAT:
            out.append([])
            size = 0
        out[-1].append(line)
        size += n
    return out


class Transient(Exception):
    """A failure worth retrying: connection refused, timeout, 5xx, 429."""


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, (urllib.error.URLError, ConnectionError, TimeoutError, OSError))


def with_retries(action: Callable[[], Any], *, give_up_after_s: float, log: Callable[[str], None], what: str,
                 sleep: Callable[[float], None] = time.sleep, max_backoff_s: float = 30.0) -> Any:
    """Run action, retrying transient errors with capped exponential backoff until the deadline.
    A non-transient error (a 4xx) is raised at once."""
    deadline = time.monotonic() + give_up_after_s
    delay = 0.5
    while True:
        try:
            return action()
        except Exception as exc:
            if not _is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            log(f"{what} failed ({describe_error(exc)}); retrying in {delay:.1f}s")
            sleep(delay)
            delay = min(delay * 2, max_backoff_s)


def describe_error(exc: BaseException) -> str:
    """An error without the URL (presigned URLs are secrets)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return f"connection error: {exc.reason}"
    return redact_text(f"{type(exc).__name__}: {exc}")


@dataclass
class Answer:
    ok: bool
    body: dict[str, Any]
    rejected: bool = False  # a 4xx: sending the same again will not help


class ControlPlane:
    """POSTs to /api/agent/runs/{id}/{heartbeat,complete} with the run's bearer token.

    The token is short-lived: a heartbeat reply may carry a fresh one, which replaces it
    (and is kept in the state file, so a restarted agent still holds a valid one)."""

    def __init__(self, config: AgentConfig, log: Callable[[str], None], token: str = "") -> None:
        self.config = config
        self.log = log
        self.rejected = 0  # the HTTP status of the last post the control plane refused (a 4xx), else 0
        self.token = token or config.token

    def switch_token(self, token: str) -> None:
        register_secret(token)
        self.token = token

    def post(self, what: str, body: dict[str, Any], *, give_up_after_s: float) -> Answer:
        url = f"{self.config.api_url}/api/agent/runs/{self.config.run_id}/{what}"
        data = json.dumps(body).encode()

        def send() -> dict[str, Any]:
            request = urllib.request.Request(url, data=data, method="POST", headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.token}",
            })
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
            try:
                reply = json.loads(raw) if raw else {}
            except ValueError:
                reply = {}
            return reply if isinstance(reply, dict) else {}

        self.rejected = 0
        try:
            return Answer(True, with_retries(send, give_up_after_s=give_up_after_s, log=self.log, what=what))
        except urllib.error.HTTPError as exc:
            self.rejected = exc.code if 400 <= exc.code < 500 else 0
            detail = exc.read(500).decode("utf-8", "replace") if exc.fp else ""
            self.log(f"{what} rejected: HTTP {exc.code}: {redact_text(detail)}")
            return Answer(False, {}, rejected=400 <= exc.code < 500 and exc.code != 429)
        except Exception as exc:
            self.log(f"{what} gave up: {describe_error(exc)}")
            return Answer(False, {})


class AgentState:
    """The agent's progress on the persistent data directory (DATA_DIR/agent-state.json).

    A RunPod resume or a VM restart starts the agent again on the same disk: what it reached
    decides what it does (issue 12.3). Fields: run_id, phase (preparing, training, trained,
    exporting, exported), trainer_exit, adapter_sha256, adapter_size, completion (the body
    to send), completion_sent, stopped + stop_reason, token (the latest renewed one).
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


# ---------------------------------------------------------------- storage


class DirStorage:
    """A directory: local storage or a mounted RunPod network volume."""

    def __init__(self, root: str) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not str(path).startswith(str(self.root) + os.sep):
            raise ValueError(f"storage key {key!r} escapes the storage directory")
        return path

    def fetch(self, key: str, dest: Path) -> None:
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.copyfile(self._path(key), tmp)
        tmp.replace(dest)

    def upload(self, key: str, src: Path) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        shutil.copyfile(src, tmp)
        tmp.replace(path)  # readers never see half an adapter


class UrlStorage:
    """Presigned URLs: GET the dataset, PUT the adapter and logs."""

    def __init__(self, log: Callable[[str], None], retry_s: float = 300.0) -> None:
        self.log = log
        self.retry_s = retry_s

    def fetch(self, url: str, dest: Path) -> None:
        tmp = dest.with_name(dest.name + ".tmp")

        def get() -> None:
            with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
                shutil.copyfileobj(response, f, 1024 * 1024)

        with_retries(get, give_up_after_s=self.retry_s, log=self.log, what="dataset download")
        tmp.replace(dest)

    def upload(self, url: str, src: Path) -> None:
        def put() -> None:
            with open(src, "rb") as f:
                request = urllib.request.Request(url, data=f, method="PUT", headers={
                    "Content-Length": str(src.stat().st_size),
                    "Content-Type": "application/octet-stream",
                })
                with urllib.request.urlopen(request, timeout=300) as response:
                    response.read()

        with_retries(put, give_up_after_s=self.retry_s, log=self.log, what=f"upload of {src.name}")


# ---------------------------------------------------------------- the agent


class Failed(Exception):
    def __init__(self, reason: str, exit_code: int | None = None, *, output_exists: bool | None = None,
                 stage: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code
        self.output_exists = output_exists  # None: look at the output directory
        self.stage = stage  # what failed, for the run's reason: dataset, training, export, upload


class Agent:
    def __init__(self, config: AgentConfig, *, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.environ = dict(os.environ if environ is None else environ)
        for secret in config.secrets():
            register_secret(secret)
        self.data_dir = config.data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.output = self.data_dir / "adapter"
        self.logs_path = self.data_dir / "logs.txt"
        self.logs_file = open(self.logs_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (lives as long as the agent)
        self.state = AgentState(self.data_dir / STATE_FILE, config.run_id)
        self.stop = threading.Event()  # SIGTERM: the machine is stopping; the agent exits
        self.halted = threading.Event()  # a heartbeat reply said stop: the agent stops training and idles
        self.halt_reason = ""
        self.resume = threading.Event()  # a heartbeat reply said resume while halted
        self.checkpoints = self.data_dir / CHECKPOINT_DIR
        self.checkpoint_seen = 0  # the last `checkpoint step=<k>` the trainer printed
        self.checkpoint_uploaded = 0
        self.lock = threading.Lock()
        self.pending: list[str] = []
        self.dropped = 0
        self.progress = 0.0
        self.phase = "preparing"
        self.trainer: subprocess.Popen[bytes] | None = None
        self.send_lock = threading.Lock()  # one heartbeat at a time: batches stay in order
        self.reported = threading.Event()  # set once complete was sent: heartbeats stop
        self.last_line = ""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # the trainer's last lines, for a failure report
        self.stop_grace_s = float(self.environ.get("TENSORANT_STOP_GRACE_S") or 30)
        saved_token = self.state.get("token")
        if isinstance(saved_token, str) and saved_token:
            register_secret(saved_token)
        self.api = ControlPlane(config, self.log, token=saved_token if isinstance(saved_token, str) else "")
        # Seams for the trainer-user tests (they cannot run as root).
        self.geteuid: Callable[[], int] = os.geteuid
        self.getpwnam: Callable[[str], Any] = pwd.getpwnam
        self.chown: Callable[[Path, int, int], None] = os.chown

    # -- output

    def log(self, message: str) -> None:
        line = redact_text(f"agent: {message}")
        print(line, file=sys.stderr, flush=True)
        self._record(line)

    def _record(self, line: str) -> None:
        # Redacted before the cut: a secret straddling the cut would otherwise keep its prefix.
        line = redact_text(line)[:MAX_LINE_CHARS]
        with self.lock:
            self.pending.append(line)
            if len(self.pending) > MAX_PENDING_LINES:
                extra = len(self.pending) - MAX_PENDING_LINES
                del self.pending[:extra]
                self.dropped += extra
            self.logs_file.write(line + "\n")

    def heartbeat(self, phase: str, progress: float | None = None) -> None:
        """Send the phase, progress and every pending line (in batches the API accepts)."""
        with self.send_lock:
            self.phase = phase
            if progress is not None:
                self.progress = progress
            if not self.reported.is_set():
                self._send_heartbeat(phase)

    def _tick(self) -> None:
        """Heartbeats every interval in every phase (a long download or upload included),
        so the control plane knows the machine is alive; phase changes send one at once."""
        while not self.stop.wait(self.config.heartbeat_interval_s) and not self.reported.is_set():
            if not self.halted.is_set():  # a halted agent asks only when it may resume (await_resume)
                self.heartbeat(self.phase)

    def _send_heartbeat(self, phase: str) -> None:
        with self.lock:
            lines, self.pending = self.pending, []
            if self.dropped:
                lines.insert(0, f"agent: {self.dropped} log lines were dropped (too many to send)")
                self.dropped = 0
        for i, batch in enumerate(_batches(lines) or [[]]):
            body = {"phase": phase, "progress": round(min(max(self.progress, 0.0), 1.0), 4), "logs": batch}
            answer = self.api.post("heartbeat", body, give_up_after_s=self.config.heartbeat_retry_s)
            if not answer.ok:
                if self.api.rejected not in (0, 409, 429):
                    # Refused as it is (too large, invalid): sending it again would be refused
                    # again forever. Drop it; the full log is uploaded with the adapter.
                    self.log(f"dropped {len(batch)} log lines the control plane refused "
                             f"(HTTP {self.api.rejected}); they stay in logs.txt")
                    continue
                with self.lock:  # keep what did not get through for the next heartbeat
                    self.pending[:0] = [line for b in _batches(lines)[i:] for line in b]
                return
            self._obey(answer.body)

    def _obey(self, reply: dict[str, Any]) -> None:
        token = reply.get("token")
        if isinstance(token, str) and token:
            self.api.switch_token(token)
            self.state.update(token=token)
        if reply.get("stop") is True and not self.halted.is_set():
            # The run left the active phases (cancelled with keep, a deadline, retained): training
            # must stop, and its output stay on the disk for recovery.
            self.halt_reason = f"the control plane said stop (the run is {reply.get('state') or 'no longer active'})"
            self.halted.set()
        elif reply.get("resume") is True and self.halted.is_set():
            self.resume.set()

    def complete(self, body: dict[str, Any]) -> bool:
        # Recorded before it is sent: an agent restarted meanwhile sends this, never trains again.
        self.state.update(completion=body)
        with self.send_lock:
            self.reported.set()
        answer = self.api.post("complete", body, give_up_after_s=self.config.complete_retry_s)
        if answer.ok or answer.rejected:  # a 4xx: the run has moved on; sending it again would not help
            self.state.update(completion_sent=True)
        return answer.ok

    def _interrupted(self) -> bool:
        return self.stop.is_set() or self.halted.is_set()

    def _record_stop(self) -> None:
        if not self.state.get("completion") and not self.state.get("stopped"):
            reason = self.halt_reason if self.halted.is_set() else "SIGTERM (the machine is stopping)"
            self.state.update(stopped=True, stop_reason=reason)
            self.log(f"stopped: {reason}; training is not run again and the output is kept")

    # -- steps

    def run(self) -> int:
        st = self.state
        if st.get("completion_sent"):
            self.log("this run already reported completion; idling")
            return self.idle()
        if st.get("stopped"):
            self.log(f"this run was stopped earlier ({st.get('stop_reason') or 'no reason recorded'}); "
                     "not training again, the output is kept; idling")
            return self.idle()
        if st.get("completion"):
            self.log("sending the completion recorded before the restart")
            self.complete(st.get("completion"))
            return self.idle()
        threading.Thread(target=self._tick, daemon=True).start()
        try:
            if st.get("phase") == "training" and st.get("trainer_exit") is None:
                # Restarted while the trainer ran (no stop recorded: a crash or a reboot). Training
                # again would overwrite its output: report instead, and let the control plane keep it.
                raise Failed("the agent restarted while the trainer was running (the machine restarted?); "
                             "training is not run again, so whatever it wrote is kept")
            if st.get("phase") not in ("trained", "exporting", "exported"):
                self.heartbeat("preparing", 0.0)
                st.update(phase="preparing")
                dataset = self.fetch_dataset()
                if self._interrupted():
                    return self._stopped()
                self.heartbeat("training", 0.0)
                st.update(phase="training")
                self.train(dataset)
                while self.halted.is_set() and not self.stop.is_set() and self.await_resume():
                    self.train(dataset, resume_from=self.latest_checkpoint())
                if self._interrupted():
                    return self._stopped()
                st.update(phase="trained", trainer_exit=0)
            else:
                self.log(f"resuming after a restart: the trainer finished earlier (phase {st.get('phase')}); "
                         "exporting its output")
            self.heartbeat("exporting", 1.0)
            st.update(phase="exporting")
            sha256, size = self.export()
            st.update(phase="exported", adapter_sha256=sha256, adapter_size=size)
            self.upload_logs()
            self.heartbeat("exporting", 1.0)
            self.complete({"status": "ok", "sha256": sha256, "size": size})
        except Failed as exc:
            if self._interrupted():
                return self._stopped()
            self.log(exc.reason)
            self.heartbeat(self.phase)
            self.upload_logs()
            exists = self.output_exists() if exc.output_exists is None else exc.output_exists
            self.complete({"status": "failed", "reason": exc.reason[:2000], "exit_code": exc.exit_code,
                           "output_exists": exists, "last_lines": [line[:500] for line in self.tail],
                           **({"stage": exc.stage} if exc.stage else {})})
        return self.idle()

    def await_resume(self) -> bool:
        """Halted by a stop reply: with a checkpoint on the disk, keep asking (one heartbeat an
        interval) until a reply says resume (True) or the machine stops (False). The stop is
        recorded first, so an agent restarted meanwhile never trains again on its own."""
        self._record_stop()
        if self.latest_checkpoint() is None:
            return False
        self.resume.clear()
        self.log("waiting for a resume (`recover --resume`) from the last checkpoint")
        while not self.stop.wait(self.config.heartbeat_interval_s):
            self.heartbeat("training")
            if self.resume.is_set():
                self.halted.clear()
                self.state.update(stopped=False, stop_reason="")
                self.log("resuming training from the last checkpoint")
                return True
        return False

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint folder (the trainer renames each into place whole)."""
        done = sorted(p for p in self.checkpoints.glob("step-*") if (p / "manifest.json").is_file())
        return done[-1] if done else None

    def export_checkpoint(self) -> None:
        """Upload the newest checkpoint's adapter as the run's adapter archive. Best effort: a
        failure only means storage keeps an older checkpoint; training goes on."""
        self.checkpoint_uploaded = self.checkpoint_seen
        folder = self.latest_checkpoint()
        if folder is None:
            return
        archive = self.data_dir / CHECKPOINT_ARCHIVE
        try:
            self._zip(folder, archive, CHECKPOINT_EXPORT)
            with zipfile.ZipFile(archive) as zf:
                if sorted(zf.namelist()) != sorted(CHECKPOINT_EXPORT):
                    # The trainer replaced this checkpoint while it was read: the next one is uploaded.
                    raise OSError(f"{folder.name} changed while it was archived")
            storage = self.storage()
            target = self.config.adapter_key if isinstance(storage, DirStorage) else self.config.adapter_upload_url
            storage.upload(target, archive)
        except Exception as exc:
            self.log(f"could not upload the checkpoint's adapter: {describe_error(exc)}")
            return
        self.log(f"checkpoint adapter uploaded ({folder.name}, {archive.stat().st_size} bytes)")

    def _stopped(self) -> int:
        self._record_stop()
        if self.stop.is_set():
            return 143
        return self.idle()

    def idle(self) -> int:
        """Stay up like a VM would, until the control plane stops or deletes the machine."""
        self.stop.wait()
        return 0

    def output_exists(self) -> bool:
        """Whether the machine holds anything worth recovering: a file the trainer wrote, an archive."""
        if self.archive_path().is_file():
            return True
        return self.output.is_dir() and any(p.is_file() for p in self.output.rglob("*"))

    def storage(self) -> DirStorage | UrlStorage:
        if self.config.storage_dir:
            return DirStorage(self.config.storage_dir)
        if self.config.dataset_url:
            return UrlStorage(self.log)
        raise Failed("the agent has no storage access (neither TENSORANT_STORAGE_DIR nor TENSORANT_DATASET_URL)")

    def fetch_dataset(self) -> Path:
        dest = self.data_dir / "dataset.jsonl"
        storage = self.storage()
        source = self.config.dataset_key if isinstance(storage, DirStorage) else self.config.dataset_url
        try:
            storage.fetch(source, dest)
        except Exception as exc:
            raise Failed(f"could not download the dataset: {describe_error(exc)}", output_exists=False,
                         stage="dataset") from exc
        if self.config.dataset_sha256:
            got = file_sha256(dest)
            if got != self.config.dataset_sha256:
                raise Failed(f"the downloaded dataset is not the validated one (sha256 {got}, validated "
                             f"{self.config.dataset_sha256}): it changed in storage; upload a new version",
                             output_exists=False, stage="dataset")
        self.log(f"dataset downloaded ({dest.stat().st_size} bytes)")
        return dest

    def trainer_env(self, dataset: Path, output: Path, resume_from: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in self.environ.items() if k not in _TRAINER_HIDDEN}
        env.update(TENSORANT_OUTPUT_DIR=str(output), TENSORANT_DATASET_PATH=str(dataset),
                   TENSORANT_BASE_MODEL=self.config.base_model, TENSORANT_CHECKPOINT_DIR=str(self.checkpoints),
                   PYTHONUNBUFFERED="1")
        if resume_from is not None:
            env["TENSORANT_RESUME_FROM"] = str(resume_from)
        # The contract's optional inputs, set only when given (unset = the trainer's defaults).
        for key, value in (("TENSORANT_BASE_MODEL_PATH", self.config.base_model_path),
                           ("TENSORANT_TRAINING", self.config.training), ("HF_TOKEN", self.config.hf_token)):
            if value:
                env[key] = value
        return env

    def trainer_popen_kwargs(self, dataset: Path, output: Path, resume_from: Path | None = None) -> dict[str, Any]:
        """Everything subprocess.Popen gets besides the command. An agent running as root with
        TENSORANT_TRAINER_USER set (the image sets it) runs the trainer as that user, owning its
        output directory: the trainer executes the customer's model code and must not read
        /proc/<agent>/environ (the run token, storage URLs) nor the state file (issue 11.11)."""
        env = self.trainer_env(dataset, output, resume_from)
        # The image puts the Hugging Face cache on the data disk (HF_HOME=/workspace/data/cache/...):
        # a retained or resumed machine keeps the downloaded base model. The trainer must write it.
        cache = Path(env["HF_HOME"]) if env.get("HF_HOME") else None
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {"shell": True, "cwd": self.data_dir, "env": env, "stdin": subprocess.DEVNULL,
                                  "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
        name = self.environ.get("TENSORANT_TRAINER_USER", "")
        if not name:
            return kwargs
        if self.geteuid() != 0:
            self.log(f"not running as root: the trainer runs as the agent's user, not {name}")
            return kwargs
        try:
            pw = self.getpwnam(name)
        except KeyError:
            raise Failed(f"TENSORANT_TRAINER_USER {name!r} is not a user on this machine", output_exists=False) \
                from None
        for owned in (output, self.checkpoints, cache):
            if owned is not None:
                self.chown(owned, pw.pw_uid, pw.pw_gid)
        os.chmod(dataset, 0o644)  # the trainer reads it; everything else of the agent's stays its own
        env.update(HOME=pw.pw_dir, USER=name, LOGNAME=name)
        kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        return kwargs

    def train(self, dataset: Path, resume_from: Path | None = None) -> None:
        """Run the trainer; resume_from: a checkpoint folder to continue from (its output folder,
        without a final adapter yet, starts empty again; the checkpoints are kept)."""
        output = self.output
        # The first attempt, or a resume on the same machine: a restart never gets here.
        shutil.rmtree(output, ignore_errors=True)
        if resume_from is None:
            shutil.rmtree(self.checkpoints, ignore_errors=True)
        output.mkdir(parents=True)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        kwargs = self.trainer_popen_kwargs(dataset, output, resume_from)
        self.log(f"starting trainer: {self.config.trainer_command}"
                 + (f" (resuming from {resume_from.name})" if resume_from else ""))
        proc = subprocess.Popen(self.config.trainer_command, **kwargs)
        self.trainer = proc
        reader = threading.Thread(target=self._read_output, args=(proc.stdout,), daemon=True)
        reader.start()
        while proc.poll() is None:
            if self.checkpoint_seen > self.checkpoint_uploaded:
                self.export_checkpoint()
            if self.stop.wait(0.05) or self.halted.is_set():
                self.stop_trainer(proc)
                if self.checkpoint_seen > self.checkpoint_uploaded:
                    self.export_checkpoint()  # the checkpoint it completed last is the one to keep
                return
        reader.join(timeout=10)
        code = proc.returncode
        self.state.update(trainer_exit=code)
        self.heartbeat("training")  # the phase's last lines and progress, before the phase changes
        if code != 0:
            tail = self._last_trainer_line()
            raise Failed(f"the trainer exited with code {code}" + (f"; last output: {tail}" if tail else ""),
                         exit_code=code)
        missing = [name for name in REQUIRED_OUTPUT if not (output / name).is_file()]
        if missing:
            raise Failed(f"the trainer exited with code 0 but wrote no {', '.join(missing)} to its output "
                         "directory", exit_code=code)
        self.log("trainer finished")

    def stop_trainer(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the trainer and everything it started, SIGKILL after the grace period.
        The trainer stays in the agent's process group (the local provider signals the group),
        so its processes are found by parentage."""
        self.log(f"stopping the trainer (SIGTERM, SIGKILL after {self.stop_grace_s:g} s)")
        victims = [proc.pid, *_descendants(proc.pid)]
        _signal_all(victims, signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in victims[1:]):
            time.sleep(0.05)
        _signal_all([pid for pid in [proc.pid, *victims[1:], *_descendants(proc.pid)] if _alive(pid)], signal.SIGKILL)
        proc.wait()

    def _read_output(self, stream: BinaryIO) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            match = _PROGRESS.match(line)
            if match:
                self.progress = min(max(float(match.group(1)), 0.0), 1.0)
            saved = _CHECKPOINT.match(line)
            if saved:
                self.checkpoint_seen = max(self.checkpoint_seen, int(saved.group(1)))
            self.last_line = line
            self.tail.append(redact_text(line))
            self._record(line)

    def _last_trainer_line(self) -> str:
        return redact_text(self.last_line)[:300]

    def archive_path(self) -> Path:
        """Where adapter.zip is kept on the machine (the product docs' recovery paths): with RunPod
        network storage reached through its S3 API (presigned URLs plus the volume's keys, i.e. an
        AWS or Azure host) it is DATA_DIR/runs/<RUN_ID>/adapter.zip, the volume's own layout;
        otherwise DATA_DIR/adapter.zip."""
        key = self.config.adapter_key
        if key and not self.config.storage_dir and self.config.adapter_upload_url:
            path = (self.data_dir / key).resolve()
            if str(path).startswith(str(self.data_dir.resolve()) + os.sep):
                return path
        return self.data_dir / "adapter.zip"

    def export(self) -> tuple[str, int]:
        output = self.output
        if not (output / "manifest.json").exists():
            self._write_manifest(output)
        final = self.archive_path()
        try:
            self._zip(output, final)
        except OSError as exc:
            raise Failed(f"could not write adapter.zip: {describe_error(exc)}", output_exists=True,
                         stage="export") from exc
        sha256, size = file_sha256(final), final.stat().st_size
        storage = self.storage()
        target = self.config.adapter_key if isinstance(storage, DirStorage) else self.config.adapter_upload_url
        try:
            storage.upload(target, final)
        except Exception as exc:
            raise Failed(f"could not upload adapter.zip: {describe_error(exc)}; it is kept on the machine at "
                         f"{final}", output_exists=True, stage="upload") from exc
        self.log(f"adapter uploaded ({size} bytes, sha256 {sha256})")
        return sha256, size

    @staticmethod
    def _zip(folder: Path, final: Path, names: tuple[str, ...] | None = None) -> None:
        """folder's regular files (or only `names` of them) zipped to final, through a temporary file."""
        tmp = final.with_name(final.name + ".tmp")
        final.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(tmp, "w", allowZip64=True) as zf:
            for path in sorted(folder.rglob("*")):
                if names is not None and path.relative_to(folder).as_posix() not in names:
                    continue
                if path.is_symlink() or not path.is_file():
                    continue  # links and special files never go into the archive
                src = open_regular(path)
                if src is None:
                    continue  # swapped for a link or a special file since the check: skipped too
                info = zipfile.ZipInfo(path.relative_to(folder).as_posix(),
                                       time.localtime(os.fstat(src.fileno()).st_mtime)[:6])
                info.compress_type = zipfile.ZIP_STORED if path.suffix == ".safetensors" else zipfile.ZIP_DEFLATED
                with src, zf.open(info, "w", force_zip64=True) as dst:
                    shutil.copyfileobj(src, dst, 1024 * 1024)
        tmp.replace(final)

    def _write_manifest(self, output: Path) -> None:
        """A trainer that writes no manifest gets one describing what it wrote."""
        files = {p.relative_to(output).as_posix(): {"sha256": file_sha256(p), "size": p.stat().st_size}
                 for p in sorted(output.rglob("*")) if p.is_file() and not p.is_symlink()}
        manifest = {"format": 1, "base_model": self.config.base_model, "rows": None,
                    "trainer": "unknown (manifest written by the agent)", "files": files}
        (output / "manifest.json").write_text(json.dumps(manifest, indent=2))

    def upload_logs(self) -> None:
        try:
            storage = self.storage()
            target = self.config.logs_key if isinstance(storage, DirStorage) else self.config.logs_upload_url
            if target and self.logs_path.exists():
                storage.upload(target, self.logs_path)
        except Exception as exc:
            # Logs are a convenience; their loss must not fail the run.
            self.log(f"could not upload logs: {describe_error(exc)}")


def _descendants(pid: int) -> list[int]:
    """Every process below pid, from /proc (Linux: the agent's only platform)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def open_regular(path: Path) -> BinaryIO | None:
    """The file opened for reading only if it is a regular file and not a link, checked on the open
    descriptor: the trainer (another user, the customer's code) owns the output directory and could
    swap a checked file for a link (symbolic or hard) to the agent's state file, which holds the run
    token, or for a FIFO that would block the export."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # a hard link could name the state file too
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser = argparse.ArgumentParser(prog="python -m shared.agent", description=summary,
                                     epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)  # no options: the environment configures the agent; --help describes it
    try:
        environ = overlay_bootstrap(os.environ)
        config = AgentConfig.from_env(environ)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    agent = Agent(config, environ=environ)

    def on_term(signum: int, frame: object) -> None:
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_term)
    return agent.run()


if __name__ == "__main__":
    raise SystemExit(main())
