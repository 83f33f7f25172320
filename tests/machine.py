"""Plays a cloud machine: runs the bootstrap a launch sent, for real, on this host.

- Cloud-init user data (as the AWS provider sent it to moto, as the Azure provider sent it to
  the fake ARM server): checked with cloud-init's own schema check (`cloud-init schema
  --config-file`, Debian package cloud-init), its write_files written under a sandbox folder
  that stands for the machine's `/` (with their permissions), and its runcmd run with bash. The
  script's absolute paths are read inside the sandbox, as a chroot would show them; curl is the
  real one. PATH starts with shims: `systemctl` (tests/systemd_shim.py: runcmd enables and starts
  the training unit; the unit's ExecStart runs once runcmd is done, and again at each later boot
  if it is enabled), `docker` (tests/docker_shim.py: pull, and run of the image's ENTRYPOINT),
  `poweroff` (recorded) and `sleep`, which adds its seconds to the simulated clock's ledger
  (LedgerClock) and returns at once, so a pull retried with backoff costs simulated minutes.
- A RunPod pod request (image, env, volume mount path): `docker run` of the same image with
  the pod's env and its volume at the mount path (RunPod runs the image's entrypoint itself).

Nothing of this bootstraps a real kernel, NVIDIA driver or Docker daemon: docker_shim.py says
what each call maps to.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.clock import FakeClock

REPO = Path(__file__).resolve().parents[1]
# What the cloud-init script may touch: these folders live under the sandbox.
SANDBOXED = ("/etc/tensorant", "/var/lib/tensorant", "/var/log/tensorant", "/usr/local/bin/tensorant",
             "/etc/systemd/system")


@dataclass(frozen=True)
class ImageSpec:
    env: dict[str, str]
    workdir: str
    entrypoint: tuple[str, ...]


@lru_cache(maxsize=1)
def image_spec(dockerfile: Path = REPO / "Dockerfile") -> ImageSpec:
    """The final stage's ENV, WORKDIR and ENTRYPOINT of the Dockerfile (what `docker run` starts)."""
    import json

    text = dockerfile.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    workdir, entry = "/", ()
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":
            env, workdir, entry = {}, "/", ()
        elif word.upper() == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
        elif word.upper() == "WORKDIR":
            workdir = rest.strip()
        elif word.upper() == "ENTRYPOINT":
            entry = tuple(json.loads(rest))
    return ImageSpec(env=env, workdir=workdir, entrypoint=entry)


class LedgerClock(FakeClock):
    """A simulated clock that also moves by the seconds the machine's `sleep` shim was asked for
    (appended to `ledger`, one number a line); they are folded into `t` as they are read, so code
    that sets `t` (the Harness's delayed messages) stays right."""

    def __init__(self, start: float, ledger: Path) -> None:
        super().__init__(start)
        self.ledger = ledger
        ledger.touch()
        self.consumed = 0
        self.total_slept = 0.0
        self.lock = threading.Lock()

    def slept(self) -> float:
        self()
        return self.total_slept

    def __call__(self) -> float:
        with self.lock:
            data = self.ledger.read_text()
            end = data.rfind("\n") + 1  # whole lines only: a write may be under way
            if end > self.consumed:
                seconds = sum(float(x) for x in data[self.consumed:end].split())
                self.t += seconds
                self.total_slept += seconds
                self.consumed = end
            return self.t


def require_debian_tool(command: str, package: str, checks: str) -> str:
    """The tool's path. Missing, the test fails in CI (.ci/run installs the Debian package) and skips elsewhere."""
    found = shutil.which(command)
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"{command} is not installed (Debian package {package}); {checks} is not checked")
    pytest.skip(f"{command} is not installed here (apt-get install {package}); .ci/run installs it")


def require_cloud_init() -> str:
    return require_debian_tool("cloud-init", "cloud-init", "the bootstrap")


def check_cloud_config(user_data: str, work: Path) -> None:
    tool = require_cloud_init()
    path = work / "user-data.yaml"
    path.write_text(user_data)
    done = subprocess.run([tool, "schema", "--config-file", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, f"cloud-init schema refused the user data:\n{done.stdout}{done.stderr}"


class Machine:
    """One played machine. `shim` options go to tests/docker_shim.py as SHIM_* variables."""

    def __init__(self, root: Path, clock_: LedgerClock, **shim: str) -> None:
        self.root = root
        self.bin = root / "shim-bin"
        self.bin.mkdir(parents=True)
        self.calls = root / "docker-calls.jsonl"
        self.clock = clock_
        self.proc: subprocess.Popen[bytes] | None = None
        self.output = root / "console.log"
        for folder in ("etc", "var/log", "var/lib", "usr/local/bin", "tmp"):  # what any machine's / has
            self.path(folder).mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(root),
            "SHIM_CALLS": str(self.calls), "SHIM_STATE": str(root), "SHIM_ROOT": str(self.path("/")),
            **{f"SHIM_{k.upper()}": v for k, v in shim.items()},
        }
        docker = self.bin / "docker"
        shim_py = shlex.quote(str(REPO / "tests/docker_shim.py"))
        docker.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shim_py} \"$@\"\n")
        systemctl = self.bin / "systemctl"
        self.systemd = f"{shlex.quote(sys.executable)} {shlex.quote(str(REPO / 'tests/systemd_shim.py'))}"
        systemctl.write_text(f"#!/bin/sh\nexec {self.systemd} \"$@\"\n")
        sleep = self.bin / "sleep"
        sleep.write_text(f"#!/bin/sh\necho \"$1\" >> {shlex.quote(str(clock_.ledger))}\n")
        # The guest's own poweroff: recorded; the test plays what the cloud then does to the machine.
        self.poweroffs = root / "poweroff-calls"
        poweroff = self.bin / "poweroff"
        poweroff.write_text(f"#!/bin/sh\necho poweroff >> {shlex.quote(str(self.poweroffs))}\n")
        self.booted = False
        for shim_file in (docker, systemctl, sleep, poweroff):
            shim_file.chmod(0o755)

    def path(self, absolute: str) -> Path:
        return self.root / "fs" / absolute.lstrip("/")

    def _sandboxed(self, text: str) -> str:
        for prefix in SANDBOXED:
            text = text.replace(prefix, str(self.path(prefix)))
        return text

    # ------------------------------------------------------------ cloud-init
    def boot(self, user_data: str) -> None:
        """Validate the user data, write its files, start its runcmd (in the background, like a VM)."""
        check_cloud_config(user_data, self.root)
        config: dict[str, Any] = yaml.safe_load(user_data)
        assert user_data.startswith("#cloud-config\n")
        assert set(config) <= {"write_files", "runcmd"}, f"cloud-init modules not played here: {set(config)}"
        for entry in config["write_files"]:
            target = self.path(entry["path"])
            assert any(entry["path"].startswith(p) for p in SANDBOXED), entry["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(self._sandboxed(entry["content"]))
            target.chmod(int(entry.get("permissions", "0644"), 8))
        commands = [self._sandboxed(" ".join(shlex.quote(str(a)) for a in cmd) if isinstance(cmd, list) else cmd)
                    for cmd in config.get("runcmd", [])]
        # cloud-init's final stage runs runcmd (the first boot only); systemd then runs the start jobs it queued.
        self.booted = True
        self._start(["bash", "-c", "\n".join([*commands, f"exec {self.systemd} boot first"])])

    def boot_again(self) -> None:
        """The cloud started the stopped machine again: its disk as it was; cloud-init's runcmd does not run
        again (once per instance), systemd starts the units enabled for multi-user.target."""
        assert self.booted and self.exited() is not None, "boot_again after the machine was powered off"
        self._start(["bash", "-c", f"exec {self.systemd} boot again"])

    def powered_off_by_guest(self) -> bool:
        return self.poweroffs.exists() and "poweroff" in self.poweroffs.read_text()

    # ------------------------------------------------------------ RunPod
    def start_pod(self, pod_input: dict[str, Any], runpod_env: dict[str, str] | None = None) -> None:
        """RunPod starts the image's entrypoint with the pod's env and its volume at the mount path (kept
        across a stop and a resume). runpod_env: what RunPod adds to every pod's environment
        (RUNPOD_POD_ID, the pod-scoped RUNPOD_API_KEY)."""
        volume = self.root / "fs" / "runpod-volume"
        volume.mkdir(parents=True, exist_ok=True)
        args = ["docker", "run", "--name", str(pod_input["name"]), "--gpus", "all", "--restart", "no"]
        for item in pod_input["env"]:
            args += ["-e", f"{item['key']}={item['value']}"]
        for key, value in (runpod_env or {}).items():
            args += ["-e", f"{key}={value}"]
        args += ["-v", f"{volume}:{pod_input['volumeMountPath']}", str(pod_input["imageName"])]
        self._start(args)

    def _start(self, command: list[str]) -> None:
        log = self.output.open("ab")
        self.proc = subprocess.Popen(command, env=self.env, cwd=self.root, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def power_off(self, grace_s: float = 20) -> None:
        """The cloud stopped or deleted the machine: everything on it ends."""
        if self.proc is None:
            return
        # The whole process group, not only its leader: bash ends at the SIGTERM at once, while the docker
        # shim and the agent it runs may not (an agent retrying a control plane that is gone). Waiting for
        # bash alone left those two running for good after the test (make test found them 16 min later).
        group = self.proc.pid
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            self.proc.wait()
            return
        deadline = time.monotonic() + grace_s
        while _group_alive(group) and time.monotonic() < deadline:
            self.proc.poll()  # reap the leader, or the group never looks empty
            time.sleep(0.05)
        if _group_alive(group):
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
            # A SIGKILL lands when the process is next scheduled: on a busy machine it still shows running
            # for a moment. Wait it out (bounded), so nothing of the machine outlives power_off.
            deadline = time.monotonic() + 5
            while _group_alive(group) and time.monotonic() < deadline:
                self.proc.poll()
                time.sleep(0.02)
        self.proc.wait()

    def console(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def docker_calls(self) -> list[list[str]]:
        import json

        if not self.calls.exists():
            return []
        return [json.loads(line) for line in self.calls.read_text().splitlines()]

    def systemctl_calls(self) -> list[list[str]]:
        import json

        calls = self.root / "systemctl-calls.jsonl"  # tests/systemd_shim.py
        return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def wait_for(predicate: Any, what: str, timeout: float = 120, *, machine: Machine | None = None,
             between: Any = None) -> Any:
    """Poll (driving the queues with `between`) until predicate() is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        if between is not None:
            between()
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            console = machine.console()[-3000:] if machine is not None else ""
            raise AssertionError(f"timed out waiting for {what}; the machine's console:\n{console}")
        time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is still running (a zombie is not)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
