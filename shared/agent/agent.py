"""The agent's steps for one run: prepare, train, export, complete, then idle.

What the state file recorded decides where a restarted agent picks up (a finished or stopped
phase is never run again); a halted run with a checkpoint waits for a resume. The parts it
drives: Reporter (shared.agent.heartbeat), TrainerSupervisor (shared.agent.trainer) and
Uploads (shared.agent.uploads).
"""

from __future__ import annotations

import threading
from pathlib import Path

from shared.agent.state import Failed
from shared.agent.trainer import TrainerSupervisor


class Agent(TrainerSupervisor):
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
                dataset = self.uploads.fetch_dataset()
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
            sha256, size = self.uploads.export()
            st.update(phase="exported", adapter_sha256=sha256, adapter_size=size)
            self.uploads.upload_logs()
            self.heartbeat("exporting", 1.0)
            self.complete({"status": "ok", "sha256": sha256, "size": size})
        except Failed as exc:
            if self._interrupted():
                return self._stopped()
            self.log(exc.reason)
            self.heartbeat(self.phase)
            self.uploads.upload_logs()
            exists = self.uploads.output_exists() if exc.output_exists is None else exc.output_exists
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

    def _interrupted(self) -> bool:
        return self.stop.is_set() or self.halted.is_set()

    def _record_stop(self) -> None:
        if not self.state.get("completion") and not self.state.get("stopped"):
            reason = self.halt_reason if self.halted.is_set() else "SIGTERM (the machine is stopping)"
            self.state.update(stopped=True, stop_reason=reason)
            self.log(f"stopped: {reason}; training is not run again and the output is kept")

    def _stopped(self) -> int:
        self._record_stop()
        if self.stop.is_set():
            return 143
        return self.idle()

    def archive_path(self) -> Path:
        """Where adapter.zip is kept on the machine, for recovery (Uploads.archive_path)."""
        return self.uploads.archive_path()

    def idle(self) -> int:
        """Stay up like a VM would, until the control plane stops or deletes the machine."""
        self.stop.wait()
        return 0
