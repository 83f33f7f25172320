"""The agent's reporting: log lines, heartbeats that carry them, the replies, the completion.

Every line (the agent's own and the trainer's) is redacted, kept in DATA_DIR/logs.txt and
queued for the next heartbeat, sent in batches within the API's limits. A heartbeat goes out
every interval and at each phase change; its reply may stop the trainer (`stop: true`), let
a halted run resume (`resume: true`) or replace the short-lived run token (`token`).

Reporter is the base of the Agent (machine.agent.agent): it holds the state every part of
the agent shares (configuration, state file, the stop and halt events).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from machine.agent.config import AgentConfig
from machine.agent.guard import Guard
from machine.agent.redact import redact_text, register_secret
from machine.agent.state import STATE_FILE, AgentState
from machine.agent.transport import ControlPlane

MAX_LINES_PER_HEARTBEAT = 500  # the API's limit (shared.models.Heartbeat)
MAX_LINE_CHARS = 2000
MAX_PENDING_LINES = 5000
# Half the API's per-heartbeat limit on log bytes (shared.services.api.agent.MAX_HEARTBEAT_LOG_BYTES).
MAX_BYTES_PER_HEARTBEAT = 128 * 1024


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


class Reporter:
    def __init__(self, config: AgentConfig, *, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.environ = dict(os.environ if environ is None else environ)
        for secret in config.secrets():
            register_secret(secret)
        self.data_dir = config.data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs_path = self.data_dir / "logs.txt"
        self.logs_file = open(self.logs_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (lives as long as the agent)
        self.state = AgentState(self.data_dir / STATE_FILE, config.run_id)
        self.stop = threading.Event()  # SIGTERM: the machine is stopping; the agent exits
        self.halted = threading.Event()  # a heartbeat reply said stop: the agent stops training and idles
        self.halt_reason = ""
        self.resume = threading.Event()  # a heartbeat reply said resume while halted
        self.lock = threading.Lock()
        self.pending: list[str] = []
        self.dropped = 0
        self.progress = 0.0
        self.phase = "preparing"
        self.send_lock = threading.Lock()  # one heartbeat at a time: batches stay in order
        self.reported = threading.Event()  # set once complete was sent: heartbeats stop
        saved_token = self.state.get("token")
        if isinstance(saved_token, str) and saved_token:
            register_secret(saved_token)
        config = self._kept_access(config)
        self.api = ControlPlane(config, self.log, token=saved_token if isinstance(saved_token, str) else "")
        self.api.on_restart = self._restarted
        # Started on a disk where it had run before (a retained machine started again, for a resume or for
        # recovery): the control plane stopped it and started it again, so the run's deadline at launch, long
        # past after a stop of hours, no longer holds (it powered the machine off within seconds of the start);
        # the runtime limit counted from this start and the unreachable bound still do.
        restarted = bool(self.state.get("phase") or self.state.get("stopped") or self.state.get("completion"))
        self.guard = Guard(config, resumed=bool(self.state.get("resumed")) or restarted)

    def _kept_access(self, config: AgentConfig) -> AgentConfig:
        """A restart exchange's storage access outlives the agent (another reboot): laid over the launch's."""
        continued = self.state.get("continue_with")
        if not isinstance(continued, str) or not continued:
            return config
        try:
            self.config = config = config.continued(continued)
        except ValueError:
            self.log("the storage access kept from a restart exchange does not decode; using the launch's")
        for secret in config.secrets():
            register_secret(secret)
        return config

    def _restarted(self, grant: dict[str, Any]) -> None:
        """The restart exchange's answer (ControlPlane): the fresh token is kept, and the storage access and
        deadline it carries replace the launch's, which may have expired while the machine was stopped."""
        bootstrap = grant.get("bootstrap")
        kept: dict[str, Any] = {}
        if isinstance(bootstrap, str) and bootstrap:
            try:
                config = self.config.continued(bootstrap)
            except ValueError:
                self.log("the restart exchange's storage access does not decode; continuing with the launch's")
            else:
                for secret in config.secrets():
                    register_secret(secret)
                self.use_config(config)
                kept["continue_with"] = bootstrap  # the state file is 0600: it holds the token already
        self.state.update(token=self.api.token, **kept)

    def use_config(self, config: AgentConfig) -> None:
        """Every part that holds the configuration gets this one (TrainerSupervisor adds its uploads)."""
        self.config = self.api.config = self.guard.config = config

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

    def kept_checkpoints(self) -> list[dict[str, object]]:
        """The checkpoint adapters kept in storage (TrainerSupervisor), reported with each heartbeat."""
        return []

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
            body: dict[str, object] = {"phase": phase, "progress": round(min(max(self.progress, 0.0), 1.0), 4),
                                       "logs": batch}
            kept = self.kept_checkpoints()
            if kept and i == 0:
                body["checkpoints"] = kept
            answer = self.api.post("heartbeat", body, give_up_after_s=self.config.heartbeat_retry_s)
            self.guard.heard(answer.ok, self.api.rejected)
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
        self.guard.heard(answer.ok, self.api.rejected)
        if answer.ok or answer.rejected:  # a 4xx: the run has moved on; sending it again would not help
            self.state.update(completion_sent=True)
        return answer.ok
