"""The trainer process under the agent: its environment and user, its output, stopping it.

The trainer is a shell command (TENSORANT_TRAINER_COMMAND). It gets its inputs through the
environment, never the run token or storage URLs; as root with TENSORANT_TRAINER_USER set it
runs as that user. Its output lines are forwarded (redacted); `progress=<x>` lines set the
progress and `checkpoint step=<k>` lines have the newest checkpoint's adapter uploaded at once.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from machine.agent.config import BOOTSTRAP_VAR, AgentConfig
from machine.agent.heartbeat import Reporter
from machine.agent.redact import redact_text
from machine.agent.state import Failed
from machine.agent.uploads import VALIDATION_FILE, Uploads

REQUIRED_OUTPUT = ("adapter_config.json", "adapter_model.safetensors")
CHECKPOINT_DIR = "checkpoint"  # under DATA_DIR: the trainer's step-<k> folders (machine.trainer.lora)
_LOSS = re.compile(r"\s(eval_)?loss=([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?:\s|$)")
_CHECKPOINT = re.compile(r"checkpoint step=(\d+)(?:\s|$)")
# The trainer wrote its final adapter and goes on with its final eval and samples (machine.trainer.lora's
# FINAL_WRITTEN): uploaded at once, so a runtime limit passing during those finds the finished training's adapter.
_FINAL = re.compile(r"trainer: final adapter written(?:\s|$)")
TAIL_LINES = 20  # the trainer lines a failure report carries
# `progress=<x>` opens a trainer's progress line; `step=.. loss=.. lr=..` may follow it.
_PROGRESS = re.compile(r"\s*progress=([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?:\s|$)")
# Never handed to the trainer: it is the customer's (or our smoke) code and has no business
# talking to the control plane or storage. The bootstrap holds all of those at once.
_TRAINER_HIDDEN = ("TENSORANT_RUN_TOKEN", "TENSORANT_DATASET_URL", "TENSORANT_ADAPTER_UPLOAD_URL",
                   "TENSORANT_LOGS_UPLOAD_URL", "TENSORANT_MERGED_UPLOAD_URL", "TENSORANT_CHECKPOINT_UPLOAD_URLS",
                   "TENSORANT_EVAL_DATASET_URL", BOOTSTRAP_VAR)


def _processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, session id) of every live process, from /proc (Linux: the agent's only platform)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    out = []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state, ppid, pgrp, session, ...
        if len(fields) > 3 and fields[0] not in ("Z", "X"):
            out.append((int(name), int(fields[1]), int(fields[3])))
    return out


def _descendants(pid: int) -> list[int]:
    """Every process below pid."""
    children: dict[int, list[int]] = {}
    for child, parent, _ in _processes():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _session(sid: int) -> list[int]:
    """Every process of session sid (the trainer's: it leads its own session)."""
    return [pid for pid, _, session in _processes() if session == sid]


def _uid_processes(uid: int) -> list[int]:
    out = []
    for pid, _, _ in _processes():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                out.append(pid)
        except OSError:
            continue
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


def newest_checkpoint(root: Path) -> Path | None:
    """The complete step-<k> folder of the highest k, compared as numbers (as strings step-99 came after
    step-100, and a trainer need not pad its numbers); a name whose k is not a number is not a checkpoint."""
    done = [(int(p.name[5:]), p) for p in root.glob("step-*")
            if p.name[5:].isascii() and p.name[5:].isdigit() and (p / "manifest.json").is_file()]
    return max(done)[1] if done else None


class TrainerSupervisor(Reporter):
    """Runs the trainer, reads its output, uploads its checkpoints and stops it when told."""

    def __init__(self, config: AgentConfig, *, environ: Mapping[str, str] | None = None) -> None:
        super().__init__(config, environ=environ)
        self.output = self.data_dir / "adapter"
        self.checkpoints = self.data_dir / CHECKPOINT_DIR
        # self.config: the launch's, or a restart exchange's storage access kept on the disk (Reporter).
        self.uploads = Uploads(self.config, self.log, output=self.output, logs_path=self.logs_path)
        self.checkpoint_seen = 0  # the last `checkpoint step=<k>` the trainer printed
        self.checkpoint_uploaded = 0
        self.final_seen = False  # the trainer printed that its final adapter is written (_FINAL)
        self.final_uploaded = False
        self.last_loss: float | None = None  # the trainer's last `loss=` and `eval_loss=` (the checkpoints' list)
        self.last_eval_loss: float | None = None
        self.trainer: subprocess.Popen[bytes] | None = None
        self.trainer_user: tuple[int, int] | None = None  # (uid, gid) when it runs as its own user
        self.last_line = ""
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # the trainer's last lines, for a failure report
        self.stop_grace_s = float(self.environ.get("TENSORANT_STOP_GRACE_S") or 30)
        # Seams for the trainer-user tests (they cannot run as root).
        self.geteuid: Callable[[], int] = os.geteuid
        self.getpwnam: Callable[[str], Any] = pwd.getpwnam
        self.chown: Callable[[Path, int, int], None] = os.chown

    def use_config(self, config: AgentConfig) -> None:
        super().use_config(config)
        self.uploads.config = config

    def trainer_env(self, dataset: Path, output: Path, resume_from: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in self.environ.items() if k not in _TRAINER_HIDDEN}
        env.update(TENSORANT_OUTPUT_DIR=str(output), TENSORANT_DATASET_PATH=str(dataset),
                   TENSORANT_BASE_MODEL=self.config.base_model, TENSORANT_CHECKPOINT_DIR=str(self.checkpoints),
                   PYTHONUNBUFFERED="1")
        if resume_from is not None:
            env["TENSORANT_RESUME_FROM"] = str(resume_from)
        validation = dataset.parent / VALIDATION_FILE
        if (self.config.eval_dataset_key or self.config.eval_dataset_url) and validation.is_file():
            env["TENSORANT_EVAL_DATASET_PATH"] = str(validation)
        # The contract's optional inputs, set only when given (unset = the trainer's defaults).
        for key, value in (("TENSORANT_BASE_MODEL_PATH", self.config.base_model_path),
                           ("TENSORANT_BASE_MODEL_REVISION", self.config.base_model_revision),
                           ("TENSORANT_TRAINING", self.config.training), ("HF_TOKEN", self.config.hf_token)):
            if value:
                env[key] = value
        return env

    def trainer_popen_kwargs(self, dataset: Path, output: Path, resume_from: Path | None = None) -> dict[str, Any]:
        """Everything subprocess.Popen gets besides the command. An agent running as root with
        TENSORANT_TRAINER_USER set (the image sets it) runs the trainer as that user, owning its
        output directory: the trainer executes the customer's model code and must not read
        /proc/<agent>/environ (the run token, storage URLs) nor the state file."""
        env = self.trainer_env(dataset, output, resume_from)
        # The image puts the Hugging Face cache on the data disk (HF_HOME=/workspace/data/cache/...):
        # a retained or resumed machine keeps the downloaded base model. The trainer must write it.
        cache = Path(env["HF_HOME"]) if env.get("HF_HOME") else None
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
        # Its own session (and process group): whatever it starts and leaves behind is found and
        # killed by session when it ends (end_trainer), before the agent reads its output.
        kwargs: dict[str, Any] = {"shell": True, "cwd": self.data_dir, "env": env, "stdin": subprocess.DEVNULL,
                                  "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT,
                                  "start_new_session": True}
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
        if "TENSORANT_EVAL_DATASET_PATH" in env:
            os.chmod(env["TENSORANT_EVAL_DATASET_PATH"], 0o644)
        env.update(HOME=pw.pw_dir, USER=name, LOGNAME=name)
        kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        # Its own user (never root): end_trainer then kills every process of it.
        self.trainer_user = (pw.pw_uid, pw.pw_gid) if pw.pw_uid != 0 else None
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
        self.final_seen = self.final_uploaded = False
        try:
            if self._watch_trainer(proc, reader):
                return
        finally:
            # Before anything of its output is read: a process it left running (a daemon) could
            # otherwise swap files while the agent exports them.
            self.end_trainer(proc)
        reader.join(timeout=10)
        self._trainer_exited(proc.returncode)

    def _watch_trainer(self, proc: subprocess.Popen[bytes], reader: threading.Thread) -> bool:
        """While the trainer runs, upload each checkpoint and the final adapter as it writes them; True when
        the run was stopped or halted (the trainer stopped, its last checkpoint uploaded)."""
        while proc.poll() is None:
            if self.checkpoint_seen > self.checkpoint_uploaded:
                self.export_checkpoint()
            if self.final_seen and not self.final_uploaded:
                self.final_uploaded = True
                self.uploads.upload_checkpoint(self.output, what="final adapter (the trainer's final eval and "
                                                                 "samples follow)")
            if self.stop.wait(0.05) or self.halted.is_set():
                # SIGTERM asks the trainer to save a checkpoint at its current step first (machine.trainer.lora):
                # a cancel that keeps the disk before the first periodic checkpoint still leaves one to resume.
                self.stop_trainer(proc)
                reader.join(timeout=5)  # its last lines, the checkpoint it saved at the stop among them
                if self.checkpoint_seen > self.checkpoint_uploaded:
                    self.export_checkpoint()  # the checkpoint it completed last is the one to keep
                return True
        return False

    def _trainer_exited(self, code: int) -> None:
        """The trainer's exit recorded and reported; Failed unless it exited 0 with every required output."""
        self.state.update(trainer_exit=code)
        self.heartbeat("training")  # the phase's last lines and progress, before the phase changes
        if code != 0:
            tail = self._last_trainer_line()
            raise Failed(f"the trainer exited with code {code}" + (f"; last output: {tail}" if tail else ""),
                         exit_code=code)
        missing = [name for name in REQUIRED_OUTPUT if not (self.output / name).is_file()]
        if missing:
            raise Failed(f"the trainer exited with code 0 but wrote no {', '.join(missing)} to its output "
                         "directory", exit_code=code)
        self.log("trainer finished")

    def stop_trainer(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the trainer and everything it started, SIGKILL after the grace period (the
        checkpoint it is writing gets the grace to finish). Its processes are its session (it leads
        its own) and its descendants (one may have started a session of its own)."""
        self.log(f"stopping the trainer (SIGTERM, SIGKILL after {self.stop_grace_s:g} s)")
        victims = self._trainer_processes(proc)
        _signal_all(victims, signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in victims if pid != proc.pid):
            time.sleep(0.05)
        self.end_trainer(proc)

    def _trainer_processes(self, proc: subprocess.Popen[bytes]) -> list[int]:
        found = [proc.pid, *_descendants(proc.pid), *_session(proc.pid)]
        if self.trainer_user is not None:
            found += _uid_processes(self.trainer_user[0])
        return sorted(set(found) - {os.getpid()})

    def end_trainer(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL to the trainer and everything of it still running, however it got there: its
        session (a child that stayed in it), its descendants (one that started its own session but
        not yet left the tree) and, when it runs as its own user, every process of that user (a
        daemon that did both: it cannot hide from kill(-1) sent as that user)."""
        for _ in range(5):  # a process forking while it is killed may leave a child: look again
            _signal_all([pid for pid in self._trainer_processes(proc) if pid != proc.pid or proc.poll() is None],
                        signal.SIGKILL)
            if self.trainer_user is not None:
                self._kill_user(*self.trainer_user)
            if proc.poll() is None:
                proc.wait()
            if not [pid for pid in self._trainer_processes(proc) if pid != proc.pid and _alive(pid)]:
                return
            time.sleep(0.05)
        self.log("some of the trainer's processes could not be killed")

    def _kill_user(self, uid: int, gid: int) -> None:
        """kill(-1, SIGKILL) as the trainer's user: every process of that user, wherever it is."""
        if uid in (0, os.getuid()) or not _uid_processes(uid):
            return
        try:
            subprocess.run([sys.executable, "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"],
                           user=uid, group=gid, extra_groups=[], env={}, cwd="/", stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            self.log(f"could not kill the trainer user's processes: {exc}")

    def _read_output(self, stream: BinaryIO) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            match = _PROGRESS.match(line)
            if match:
                self.progress = min(max(float(match.group(1)), 0.0), 1.0)
            if match or line.startswith("eval "):
                loss = _LOSS.search(line)
                if loss:
                    setattr(self, "last_eval_loss" if loss.group(1) else "last_loss", float(loss.group(2)))
            saved = _CHECKPOINT.match(line)
            if saved:
                self.checkpoint_seen = max(self.checkpoint_seen, int(saved.group(1)))
            if _FINAL.match(line):
                self.final_seen = True
            self.last_line = line
            self.tail.append(redact_text(line))
            self._record(line)

    def _last_trainer_line(self) -> str:
        return redact_text(self.last_line)[:300]

    def kept_checkpoints(self) -> list[dict[str, object]]:
        return list(self.uploads.kept)

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint folder (the trainer renames each into place whole)."""
        return newest_checkpoint(self.checkpoints)

    def export_checkpoint(self) -> None:
        """Upload the newest checkpoint's adapter as the run's adapter archive (best effort)."""
        self.checkpoint_uploaded = self.checkpoint_seen
        folder = self.latest_checkpoint()
        if folder is not None:
            self.uploads.upload_checkpoint(folder, self.last_loss, self.last_eval_loss)
