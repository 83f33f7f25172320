"""The agent's steps for one run: prepare, train, export, complete, then idle.

What the state file recorded decides where a restarted agent picks up (a finished or stopped
phase is never run again); a halted run with a checkpoint waits for a resume. The parts it
drives: Reporter (machine.agent.heartbeat), TrainerSupervisor (machine.agent.trainer) and
Uploads (machine.agent.uploads).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from machine.agent.gpu import EXIT_GPU, driver_problem
from machine.agent.guard import POWEROFF_EXIT, stop_runpod_pod
from machine.agent.state import Failed
from machine.agent.trainer import TrainerSupervisor

AGENT_PHASES = ("provisioning", "preparing", "training", "exporting")  # the run states an agent reports in


class Agent(TrainerSupervisor):
    def run(self) -> int:
        self.working = False  # preparing, training, exporting or awaiting a resume: the guard's every bound applies
        self.self_stopping = False
        self.poweroff_requested = False
        self.settled = threading.Event()  # the run's steps are done or stopped: safe to power off
        threading.Thread(target=self._watch, daemon=True).start()
        code = self._run()
        return POWEROFF_EXIT if self.poweroff_requested else code

    def _run(self) -> int:
        st = self.state
        if st.get("completion_sent"):
            self.log("this run already reported completion; idling")
            return self.idle()
        resumable = self._resumable()
        if st.get("stopped") and not resumable:
            self.log(f"this run was stopped earlier ({st.get('stop_reason') or 'no reason recorded'}); "
                     "not training again, the output is kept; idling")
            return self.idle()
        if st.get("completion"):
            self.log("sending the completion recorded before the restart")
            self.complete(st.get("completion"))
            return self.idle()
        if not st.get("phase") and (problem := driver_problem(self.environ)) is not None:
            return self.boot_failed(problem)
        threading.Thread(target=self._tick, daemon=True).start()
        self.working = True
        try:
            if not self._train_phases(resumable) or not self._export():
                return self._stopped()
        except Failed as exc:
            if self._interrupted():
                return self._stopped()
            self._report_failure(exc)
        return self.idle()

    def _resumable(self) -> bool:
        """Stopped while training with a checkpoint on this disk, then started again (`recover --resume`, or
        to fetch files): train again from the checkpoint only when the control plane says resume."""
        st = self.state
        return bool(st.get("stopped") and st.get("phase") == "training" and self.latest_checkpoint() is not None
                    and not st.get("completion"))

    def _train_phases(self, resumable: bool) -> bool:
        """Prepare and train, or pick up where the phases recorded before a restart left off; False when
        the run was stopped meanwhile."""
        st = self.state
        if resumable:
            self.log(f"restarted after a stop ({st.get('stop_reason') or 'no reason recorded'}) with a "
                     "checkpoint on the disk; waiting for the control plane to say resume")
            self.halt_reason = str(st.get("stop_reason") or "stopped before the restart")
            self.halted.set()
            return self._train_through_halts(self.uploads.dataset_path())
        if st.get("phase") == "training" and st.get("trainer_exit") is None:
            # Restarted while the trainer ran (no stop recorded: a crash or a reboot). Training
            # again would overwrite its output: report instead, and let the control plane keep it.
            raise Failed("the agent restarted while the trainer was running (the machine restarted?); "
                         "training is not run again, so whatever it wrote is kept")
        if st.get("phase") in ("trained", "exporting", "exported"):
            self.log(f"resuming after a restart: the trainer finished earlier (phase {st.get('phase')}); "
                     "exporting its output")
            return True
        self.heartbeat("preparing", 0.0)
        st.update(phase="preparing")
        dataset = self.uploads.fetch_dataset()
        if self._interrupted():
            return False
        self.heartbeat("training", 0.0)
        st.update(phase="training")
        self.train(dataset)
        return self._train_through_halts(dataset)

    def _train_through_halts(self, dataset: Path) -> bool:
        """Each resume the control plane sends trains again from the last checkpoint; False when stopped."""
        while self.halted.is_set() and not self.stop.is_set() and self.await_resume():
            self.train(dataset, resume_from=self.latest_checkpoint())
        if self._interrupted():
            return False
        self.state.update(phase="trained", trainer_exit=0)
        return True

    def _export(self) -> bool:
        """Upload the adapter (and the merged model), then report completion; False when stopped first."""
        st = self.state
        self.heartbeat("exporting", 1.0)
        if self._interrupted():
            # Stopped meanwhile (the runtime limit sent the run to verify the adapter already uploaded):
            # uploading another now would replace the archive being verified.
            return False
        st.update(phase="exporting")
        sha256, size = self.uploads.export()
        merged = self.uploads.export_merged()
        st.update(phase="exported", adapter_sha256=sha256, adapter_size=size)
        self.uploads.upload_logs()
        self.heartbeat("exporting", 1.0)
        self.complete({"status": "ok", "sha256": sha256, "size": size, **merged})
        return True

    def _report_failure(self, exc: Failed) -> None:
        """A failed phase reported as the run's completion, with whether output worth recovering exists."""
        self.log(exc.reason)
        self.heartbeat(self.phase)
        self.uploads.upload_logs()
        exists = self.uploads.output_exists() if exc.output_exists is None else exc.output_exists
        # A checkpoint on the disk is output worth recovering: a resume from a corrupt one fails in the
        # trainer, but the run must stay recoverable (its last good adapter is in storage).
        exists = exists or self.latest_checkpoint() is not None
        self.complete({"status": "failed", "reason": exc.reason[:2000], "exit_code": exc.exit_code,
                       "output_exists": exists, "last_lines": [line[:500] for line in self.tail],
                       **({"stage": exc.stage} if exc.stage else {})})

    def boot_failed(self, reason: str) -> int:
        """This machine cannot train at all (its driver is too old): reported before any heartbeat as a
        failed start, which the control plane releases at once, not retained. The agent then exits, so
        the bootstrap script's own report (stage agent, this exit code) says the same."""
        self.log(reason)
        self.api.post("boot-failed", {"stage": "agent", "exit_code": EXIT_GPU, "attempts": 1,
                                      "last_lines": [f"agent: {reason}"[:2000]]},
                      give_up_after_s=self.config.complete_retry_s)
        return EXIT_GPU

    def await_resume(self) -> bool:
        """Halted by a stop reply: with a checkpoint on the disk, keep asking (one heartbeat an
        interval) until a reply says resume (True) or the machine stops (False). The stop is
        recorded first, so an agent restarted meanwhile never trains again on its own."""
        self._record_stop()
        if self.latest_checkpoint() is None or self.self_stopping:
            return False
        self.resume.clear()
        self.log("waiting for a resume (`recover --resume`) from the last checkpoint")
        while not self.stop.wait(self.config.heartbeat_interval_s):
            self.heartbeat("training")
            if self.resume.is_set():
                self.halted.clear()
                self.state.update(stopped=False, stop_reason="", resumed=True)
                self.guard.resumed = True
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
        """Stay up like a VM would, until the control plane stops or deletes the machine. A completion
        sent is confirmed first (confirm_completion)."""
        self.working = False
        self.settled.set()
        if self.state.get("completion") and not self.self_stopping:
            self.confirm_completion()
        self.stop.wait()
        return 0

    def confirm_completion(self) -> None:
        """Re-send the completion until the control plane shows the run past it. An acknowledged
        completion can still be lost (the store lost the write after the answer): a heartbeat reply says
        where the run is, and a run still in an agent phase gets the completion again (idempotent on
        the digest). Ends on any other state, on a refusal (the run has ended), or after complete_retry_s."""
        deadline = time.monotonic() + self.config.complete_retry_s
        body = {"phase": self.phase if self.phase in AGENT_PHASES else "exporting", "progress": 1.0, "logs": []}
        while not self.stop.wait(self.config.heartbeat_interval_s) and time.monotonic() < deadline:
            answer = self.api.post("heartbeat", body, give_up_after_s=self.config.heartbeat_retry_s)
            self.guard.heard(answer.ok, self.api.rejected)
            if answer.rejected:
                return
            if not answer.ok:
                continue
            if answer.body.get("state") not in AGENT_PHASES:
                return
            self.log(f"the control plane shows the run {answer.body.get('state')}: its completion was lost; "
                     "sending it again")
            again = self.api.post("complete", self.state.get("completion") or {},
                                  give_up_after_s=self.config.heartbeat_retry_s)
            self.guard.heard(again.ok, self.api.rejected)

    def _watch(self) -> None:
        """The guard's bounds (machine.agent.guard), checked every few seconds whatever the agent is doing."""
        while not self.stop.wait(min(self.config.heartbeat_interval_s, 5.0)):
            why = self.guard.reason(working=self.working)
            if why:
                self.self_stop(why)
                return

    def self_stop(self, why: str) -> None:
        """Stop training (its last checkpoint is uploaded), upload the logs, record the stop and power the
        machine off keeping its disk (machine.agent.guard says how on each cloud)."""
        if self.self_stopping:
            return
        self.self_stopping = True
        self.log(f"stopping by itself: {why}. Training stops, its last checkpoint and the logs are uploaded, "
                 "and the machine is powered off with its disk kept")
        self.halt_reason = f"stopped by the agent itself: {why}"
        self.halted.set()
        # The main thread stops the trainer and uploads its last checkpoint (train()), then settles in idle.
        if not self.settled.wait(2 * self.stop_grace_s + 120):
            self.log("the run's current step did not end in time; powering off anyway")
        try:
            self.uploads.upload_logs()
        except Exception as exc:  # best effort: the logs stay on the disk
            self.log(f"the logs were not uploaded: {type(exc).__name__}")
        if not self.state.get("completion"):
            self.state.update(stopped=True, stop_reason=self.halt_reason)
        self.state.update(self_stopped=why)
        mode = self.config.poweroff
        if mode == "exit":
            self.log(f"exiting with code {POWEROFF_EXIT}: the machine's script powers it off")
            self.poweroff_requested = True
            self.stop.set()
        elif mode == "runpod":
            if stop_runpod_pod(self.environ, self.log):
                self.log("RunPod was asked to stop this pod")
        else:
            self.log("this machine is not powered off from inside (local provider); idling")
