"""The `local` compute provider: a run's "machine" is the agent running as a local process.

For running the whole control plane without a cloud (and for tests). Linux only: the
process table is read from /proc.

- The machine: `python -m machine.agent`, started detached in its own session through a
  short-lived launcher (so it is never our zombie), with the work directory
  `<local_root>/machines/<ref.name>/` (marker.json; data/ is TENSORANT_DATA_DIR, the
  machine's "disk").
- Ownership marks live in the process environment (TENSORANT_MANAGED=true,
  TENSORANT_DEPLOYMENT_ID, TENSORANT_ORG, TENSORANT_RUN_ID), set at exec and inherited by
  the trainer; /proc/<pid>/environ is how list_managed and every operation find them.
  A process is signalled only after its marks were read back: never anything else.
- launch is idempotent: under a per-run file lock it looks for a live marked process
  first; a "spawning" note is written to marker.json before the spawn, the pid after it.
- retain = SIGSTOP (a stopped VM: process and directory kept); start = SIGCONT;
  release = SIGKILL, then remove the directory; done only when neither is left.
Nothing bills.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel

import shared
from machine.trainer.locks import file_lock
from shared import clock
from shared.errors import PermanentError, RetryableError
from shared.models import Check, CloudResource, GpuOffer, MachineState
from shared.providers.base import CloudProgress, ComputeProvider, Description, LaunchSpec, RunRef
from shared.providers.local import catalog, checks
from shared.providers.local.config import LocalConfig
from shared.settings import Settings

MARK_MANAGED = "TENSORANT_MANAGED"
MARK_DEPLOYMENT = "TENSORANT_DEPLOYMENT_ID"
MARK_ORG = "TENSORANT_ORG"
MARK_RUN = "TENSORANT_RUN_ID"
# The machines directory of the control plane that started the process: two control planes on
# one host (two checkouts, two test sessions) with the same deployment id never touch each
# other's agents.
MARK_ROOT = "TENSORANT_LOCAL_MACHINES"
BILLING_NOTE = "local: nothing bills"
# How long retain waits for a SIGSTOP to show in /proc before it answers "stopping" (milliseconds, as a rule).
STOP_CONFIRM_S = 2.0
# What the run's agent processes look like -> machine state (see describe).
STATE_MAP = {
    "none": MachineState.gone,  # no marked process left (the work directory may be kept)
    "all stopped": MachineState.stopped,  # SIGSTOP: a stopped VM
    "some stopped": MachineState.stopping,
    "running": MachineState.running,
}
# The real trainer, preparing the base model in the local model cache first (see that module).
DEFAULT_TRAINER = f"{sys.executable} -m shared.providers.local.trainer"
REPO_ROOT = Path(shared.__file__).resolve().parent.parent
PR_SET_DUMPABLE = 4  # <linux/prctl.h>

# Starts the agent in a new session and exits at once, so the agent is reparented to init
# (which reaps it) instead of becoming a zombie of the control plane. Prints the agent pid.
_LAUNCHER = (
    "import subprocess, sys\n"
    "log = open(sys.argv[1], 'ab')\n"
    "p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,\n"
    "                     start_new_session=True, close_fds=True)\n"
    "print(p.pid, flush=True)\n"
)


@dataclass(frozen=True)
class Proc:
    pid: int
    pgid: int
    state: str  # /proc state letter: R S D T t Z ...
    deployment: str
    org: str
    run_id: str
    started_at: datetime
    root: str = ""

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks) or None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()  # the command name may hold spaces and ')'
    return rest[0], int(rest[2]), int(rest[19])


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's process: not ours either way
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def scan() -> tuple[list[Proc], dict[int, list[int]]]:
    """Every live (non-zombie) marked process, and every process group's members."""
    ticks = os.sysconf("SC_CLK_TCK")
    boot = _boot_time()
    marked: list[Proc] = []
    groups: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        state, pgid, start = stat
        groups.setdefault(pgid, []).append(pid)
        env = _environ(pid)
        if env.get(MARK_MANAGED) != "true" or not env.get(MARK_DEPLOYMENT) or not env.get(MARK_RUN):
            continue
        marked.append(Proc(pid=pid, pgid=pgid, state=state, deployment=env[MARK_DEPLOYMENT],
                           org=env.get(MARK_ORG, ""), run_id=env[MARK_RUN],
                           started_at=datetime.fromtimestamp(boot + start / ticks, tz=UTC),
                           root=env.get(MARK_ROOT, "")))
    return marked, groups


def protect_host() -> None:
    """Make this (control-plane) process non-dumpable before it starts local agents.

    The agent and trainer run as the same user as the host, and any same-user process may
    read /proc/<pid>/environ of another: the host's environment holds the JWT secret, the
    encryption key and the storage connection string. A non-dumpable process's /proc files
    belong to root, so a trainer cannot read them (nor attach to its memory). Exec resets the
    flag, so the agents we start stay readable for scan(). Linux only; best effort elsewhere.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class LocalCompute:
    name = "local"

    def __init__(self, config: LocalConfig, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.deployment = settings.deployment_id
        self.root = Path(settings.local_root).resolve()
        self.machines = self.root / "machines"

    # ---------------------------------------------------------------- helpers

    def trainer_command(self) -> str:
        """The operator's setting only (TENSORANT_TRAINER_COMMAND; tests: the smoke trainer), else
        the real LoRA trainer on this host's CPU (shared/providers/local/trainer.py); never per org."""
        return self.settings.trainer_command or DEFAULT_TRAINER

    def _ours(self, p: Proc) -> bool:
        # A process without the root mark predates it: judged by its deployment alone.
        return p.deployment == self.deployment and p.root in ("", str(self.machines))

    def workdir(self, ref: RunRef) -> Path:
        return self.machines / ref.name

    def _check_ref(self, ref: RunRef) -> None:
        if ref.deployment != self.deployment:
            raise PermanentError(f"run {ref.run_id} belongs to deployment {ref.deployment!r}, not "
                                 f"{self.deployment!r}; this control plane does not touch it")

    def _procs(self, ref: RunRef) -> tuple[list[Proc], dict[int, list[int]]]:
        marked, groups = scan()
        mine = [p for p in marked if self._ours(p) and p.run_id == ref.run_id]
        return mine, groups

    def _lock(self, ref: RunRef) -> AbstractContextManager[None]:
        """One launch per run at a time, across processes (queue messages may run twice at once)."""
        return file_lock(self.machines / ".locks" / f"{ref.name}.lock")

    def _marker(self, workdir: Path) -> dict[str, object]:
        try:
            value = json.loads((workdir / "marker.json").read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def _write_marker(self, workdir: Path, marker: dict[str, object]) -> None:
        tmp = workdir / "marker.json.tmp"
        tmp.write_text(json.dumps(marker, indent=2))
        tmp.replace(workdir / "marker.json")

    def _ensure_workdir(self, ref: RunRef) -> Path:
        """Create the work directory with its marker in one rename, so no unmarked directory exists."""
        workdir = self.workdir(ref)
        if (workdir / "marker.json").exists():
            return workdir
        self.machines.mkdir(parents=True, exist_ok=True)
        tmp = self.machines / f".creating-{ref.name}-{secrets.token_hex(4)}"
        (tmp / "data").mkdir(parents=True)
        self._write_marker(tmp, {"deployment": ref.deployment, "org": ref.org, "run_id": ref.run_id,
                                 "name": ref.name, "created_at": clock.now().isoformat(), "spawns": []})
        try:
            tmp.rename(workdir)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (workdir / "marker.json").exists():
                raise
        return workdir

    def _resources(self, ref: RunRef, procs: list[Proc]) -> list[CloudResource]:
        out: list[CloudResource] = []
        for leader in sorted({p.pgid for p in procs}):
            members = [p for p in procs if p.pgid == leader]
            head = next((p for p in members if p.pid == leader), members[0])
            out.append(CloudResource(
                provider=self.name, kind="process", id=str(leader), name=ref.name, region="local",
                run_id=ref.run_id, org=head.org or ref.org, deployment=self.deployment,
                created_at=head.started_at, state="stopped" if all(p.stopped for p in members) else "running",
                extra={"pid": str(head.pid), "workdir": str(self.workdir(ref))}))
        workdir = self.workdir(ref)
        if workdir.exists():
            out.append(self._workdir_resource(workdir, self._marker(workdir), ref.name))
        return out

    def _workdir_resource(self, workdir: Path, marker: dict[str, object], name: str) -> CloudResource:
        created = marker.get("created_at")
        return CloudResource(
            provider=self.name, kind="workdir", id=str(workdir), name=name, region="local",
            run_id=str(marker.get("run_id", "")), org=str(marker.get("org", "")),
            deployment=str(marker.get("deployment", "")),
            created_at=datetime.fromisoformat(created) if isinstance(created, str) else None, state="present")

    def _signal(self, procs: list[Proc], groups: dict[int, list[int]], sig: signal.Signals) -> None:
        """Signal the run's process groups: the whole group at once when every member carries
        the run's marks, otherwise only the marked members (never an unmarked process)."""
        marked_pids = {p.pid for p in procs}
        for pgid in sorted({p.pgid for p in procs}):
            if pgid in (os.getpgrp(), 0, 1):
                continue  # never our own group (defensive: the agent always has its own session)
            members = groups.get(pgid, [])
            try:
                if members and all(pid in marked_pids for pid in members):
                    os.killpg(pgid, sig)
                else:
                    for pid in sorted(marked_pids & set(members)):
                        os.kill(pid, sig)
            except ProcessLookupError:
                pass  # already gone
            except PermissionError as exc:
                raise PermanentError(f"not allowed to signal process group {pgid}: {exc}") from exc

    def _agent_env(self, spec: LaunchSpec, workdir: Path) -> dict[str, str]:
        # Built from nothing: only what a process needs to run (checks.INHERITED) and the run's
        # bootstrap, never the control plane's own environment (JWT secret, encryption key,
        # storage connection string).
        env = {k: os.environ[k] for k in checks.INHERITED if k in os.environ}
        env.update(spec.bootstrap.env)
        env["TENSORANT_DATA_DIR"] = str(workdir / "data")
        env.setdefault("TENSORANT_HEARTBEAT_INTERVAL_S", "1")
        # The operator's command only; nothing from the bootstrap or the org chooses it.
        env["TENSORANT_TRAINER_COMMAND"] = self.trainer_command()
        # Where the local trainer keeps converted / built base models, shared by every run.
        env["TENSORANT_MODEL_CACHE"] = str(self.root / "models")
        if os.environ.get("TENSORANT_TORCH_THREADS"):
            # The operator may cap the trainer's CPU threads (a busy host trains tiny models faster on one).
            env["TENSORANT_TORCH_THREADS"] = os.environ["TENSORANT_TORCH_THREADS"]
        env["PYTHONPATH"] = str(REPO_ROOT)
        env["PYTHONUNBUFFERED"] = "1"
        # The marks go last so nothing in the bootstrap can change them.
        env.update({MARK_MANAGED: "true", MARK_DEPLOYMENT: spec.ref.deployment, MARK_ORG: spec.ref.org,
                    MARK_ROOT: str(self.machines), MARK_RUN: spec.ref.run_id})
        return env

    # ---------------------------------------------------------------- Protocol

    def preflight(self, offer: GpuOffer, ref: RunRef | None = None) -> str | None:
        """This host has no quota: nothing is known against a launch."""
        return None

    def scope(self) -> dict[str, str]:
        """Its machines directory: a control plane sees only the agents and work directories under its own
        local root, so a run launched under another root (a second dev host on the same Azurite) is never
        judged, retained or released from here (shared/runs/scope.refuse_other_scope)."""
        return {"root": str(self.machines)}

    def validate(self) -> list[Check]:
        """Every connection check (see checks.py); starts no agent."""
        return checks.run_checks(self.machines, self.trainer_command(), REPO_ROOT)

    def offers(self) -> list[GpuOffer]:
        return catalog.offers(self.config)

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        ref = spec.ref
        self._check_ref(ref)
        with self._lock(ref):
            procs, _ = self._procs(ref)
            if procs:
                return self._resources(ref, procs)
            workdir = self._ensure_workdir(ref)
            marker = self._marker(workdir)
            previous = marker.get("spawns")
            spawns: list[dict[str, object]] = list(previous) if isinstance(previous, list) else []
            # Write-ahead: a crash after the spawn still leaves a note (and a marked process
            # the next launch finds) rather than an unexplained second agent.
            spawns.append({"at": clock.now().isoformat(), "state": "spawning", "pid": None})
            protect_host()
            self._write_marker(workdir, marker | {"spawns": spawns})
            try:
                result = subprocess.run(
                    [sys.executable, "-c", _LAUNCHER, str(workdir / "agent.log"), sys.executable, "-m", "machine.agent"],
                    env=self._agent_env(spec, workdir), cwd=workdir, capture_output=True, text=True, timeout=60,
                    check=True)
                pid = int(result.stdout.strip())
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                raise RetryableError(f"could not start the local agent: {exc}", retry_after_s=5) from exc
            spawns[-1] = spawns[-1] | {"state": "spawned", "pid": pid}
            self._write_marker(workdir, marker | {"spawns": spawns})
            procs, _ = self._procs(ref)
            if not procs:
                raise RetryableError(f"the local agent (pid {pid}) exited at once; see {workdir / 'agent.log'}",
                                     retry_after_s=5)
            return self._resources(ref, procs)

    def describe(self, ref: RunRef, resources: list[CloudResource]) -> Description:
        procs, _ = self._procs(ref)
        found = self._resources(ref, procs)
        stopped = [p.stopped for p in procs]
        key = "none" if not procs else "all stopped" if all(stopped) else "some stopped" if any(stopped) else "running"
        detail = {"none": "no agent process" + (" (its work directory is kept)" if self.workdir(ref).exists() else ""),
                  "all stopped": "agent process stopped", "some stopped": "stopping",
                  "running": "agent process running"}[key]
        return Description(state=STATE_MAP[key], detail=detail, resources=found)

    def retain(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        self._check_ref(ref)
        procs, groups = self._procs(ref)
        if not procs:
            return CloudProgress(done=True, detail="no agent process is running; the work directory is kept",
                           billing_note=BILLING_NOTE)
        if not all(p.stopped for p in procs):
            self._signal(procs, groups, signal.SIGSTOP)
            # The kernel stops them within milliseconds, but /proc read at once still said running: `runs
            # stop` answered "stopping" and left the machine shown as started for recovery until a second
            # stop. A short wait for the stop to show confirms it in the same call.
            deadline = time.monotonic() + STOP_CONFIRM_S
            procs, _ = self._procs(ref)
            while procs and not all(p.stopped for p in procs) and time.monotonic() < deadline:
                time.sleep(0.02)
                procs, _ = self._procs(ref)
        if procs and not all(p.stopped for p in procs):
            return CloudProgress(done=False, detail="stopping the agent process", retry_after_s=0.2,
                           billing_note=BILLING_NOTE)
        return CloudProgress(done=True, detail=f"agent process stopped; work directory {self.workdir(ref)} kept",
                       billing_note=BILLING_NOTE)

    def start(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        self._check_ref(ref)
        procs, groups = self._procs(ref)
        if not procs:
            raise PermanentError("the run's local agent process is gone and cannot be started again; "
                                 "recover the adapter from storage or upload it instead")
        if any(p.stopped for p in procs):
            self._signal(procs, groups, signal.SIGCONT)
            procs, _ = self._procs(ref)
        if any(p.stopped for p in procs):
            return CloudProgress(done=False, detail="resuming the agent process", retry_after_s=0.2)
        return CloudProgress(done=True, detail="agent process running again", billing_note=BILLING_NOTE)

    def release(self, ref: RunRef, resources: list[CloudResource]) -> CloudProgress:
        self._check_ref(ref)
        procs, groups = self._procs(ref)
        if procs:
            self._signal(procs, groups, signal.SIGKILL)
            procs, _ = self._procs(ref)
            if procs:
                return CloudProgress(done=False, detail=f"waiting for {len(procs)} agent process(es) to exit",
                               retry_after_s=0.2, billing_note=BILLING_NOTE)
        workdir = self.workdir(ref)
        leftovers = [workdir, *self.machines.glob(f".creating-{ref.name}-*")] if self.machines.exists() else []
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)
        remaining = [p for p in leftovers if p.exists()]
        if remaining:
            return CloudProgress(done=False, detail=f"could not remove {remaining[0]} yet", retry_after_s=1.0,
                           billing_note=BILLING_NOTE)
        return CloudProgress(done=True, detail="agent process and work directory removed", billing_note=BILLING_NOTE)

    def list_managed(self) -> Iterable[CloudResource]:
        marked, _ = scan()
        by_run: dict[tuple[str, str], list[Proc]] = {}
        for p in marked:
            if self._ours(p):  # never another deployment's or another control plane's processes
                by_run.setdefault((p.org, p.run_id), []).append(p)
        for (org, run_id), procs in sorted(by_run.items()):
            ref = RunRef(deployment=self.deployment, org=org, run_id=run_id)
            yield from (r for r in self._resources(ref, procs) if r.kind == "process")
        if not self.machines.exists():
            return
        for entry in sorted(self.machines.iterdir()):
            if not entry.is_dir() or entry.name == ".locks":
                continue
            marker = self._marker(entry)
            if marker.get("deployment") != self.deployment:
                continue  # unmarked or another deployment's: not ours to report
            yield self._workdir_resource(entry, marker, str(marker.get("name", entry.name)))


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    """The registry's factory: mypy checks LocalCompute against the Protocol here."""
    if not isinstance(config, LocalConfig):
        raise TypeError(f"local needs a LocalConfig, not {type(config).__name__}")
    return LocalCompute(config, settings)
