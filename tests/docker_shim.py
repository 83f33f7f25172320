"""`docker` on a machine played by tests/machine.py (no Docker engine here).

Maps the two calls the bootstrap makes onto something real:
- `docker pull IMAGE`: succeeds, or fails like a registry would (SHIM_PULL_FAILS: how many
  pulls fail before one succeeds; "all" never succeeds).
- `docker run --name N --gpus all --restart no --env-file F [-e K=V] -v HOST:CONTAINER IMAGE`:
  SHIM_RUN says how:
    agent      (default) the image's ENTRYPOINT run on this host the way the image runs it: the
               Dockerfile's ENV and ENTRYPOINT (tests/machine.image_spec), the image's files
               (WORKDIR, PYTHONPATH) mapped to the repository, the volume's container path mapped
               to its host folder in every environment value (the decoded bootstrap included),
               as the mount would show it. The trainer user exists only in the image: dropped.
               SHIM_AGENT_ENV (JSON) adds variables, as other ENV lines of the image would.
    buildah    the locally built image (SHIM_IMAGE, `make image-check`): `buildah from`, then
               `buildah run --isolation chroot` of the image's own ENTRYPOINT with the env file's
               variables and the volume, on the host network; the working container is removed.
    no-gpu     docker's own failure without the NVIDIA runtime (exit code 125).
    no-agent   an image whose agent cannot start: the entrypoint runs without the agent's files (in an
               empty folder, without site-packages, where this checkout is installed).
    exit:N     a container that prints 50 lines ("container line <k>") and exits with code N (the
               bootstrap's own steps, without an agent).
- `docker rm -f N`: nothing to remove.
Every call is appended to SHIM_CALLS (one JSON line), so tests see what the machine ran.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_GPU = ('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].\n'
          "Run 'docker run --help' for more information")


def _record(args: list[str]) -> None:
    calls = os.environ.get("SHIM_CALLS")
    if calls:
        with open(calls, "a") as f:
            f.write(json.dumps(args) + "\n")


def _pull(image: str) -> int:
    fails = os.environ.get("SHIM_PULL_FAILS", "0")
    counter = Path(os.environ.get("SHIM_STATE", tempfile.gettempdir())) / "pulls"
    done = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(done + 1))
    if fails == "all" or done < int(fails):
        print(f"Error response from daemon: Head \"https://ghcr.io/v2/{image.split(':')[0].split('/', 1)[-1]}/manifests/"
              f"{image.rsplit(':', 1)[-1]}\": denied: denied", file=sys.stderr)
        return 1
    print(f"{image.rsplit(':', 1)[-1]}: Pulling from {image.split(':')[0]}\nStatus: Downloaded newer image for {image}")
    return 0


def _parse_run(args: list[str]) -> tuple[dict[str, str], list[tuple[str, str]], str]:
    env: dict[str, str] = {}
    volumes: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--name", "--gpus", "--restart", "--shm-size", "--log-driver", "--log-opt"):
            i += 2
        elif a == "--env-file":
            for line in Path(args[i + 1]).read_text().splitlines():
                if line.strip() and not line.startswith("#"):
                    key, _, value = line.partition("=")
                    env[key] = value
            i += 2
        elif a in ("-e", "--env"):
            key, _, value = args[i + 1].partition("=")
            env[key] = value
            i += 2
        elif a in ("-v", "--volume"):
            host, container = args[i + 1].split(":")[:2]
            volumes.append((host, container))
            i += 2
        elif a.startswith("-"):
            raise SystemExit(f"docker shim: unexpected option {a}")
        else:
            return env, volumes, a
    raise SystemExit("docker shim: no image named")


def _map(value: str, mounts: list[tuple[str, str]]) -> str:
    for host, container in mounts:
        if value == container or value.startswith(container.rstrip("/") + "/"):
            return host + value[len(container.rstrip("/")):]
    return value


def _agent_env(env: dict[str, str], volumes: list[tuple[str, str]]) -> dict[str, str]:
    from tests.machine import image_spec

    spec = image_spec()
    mounts = [*volumes, (str(REPO), spec.workdir)]
    # A container starts from the image's environment, not the host's: only a PATH where `python` is
    # this interpreter (the image's python) and the locale.
    out = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    out.update({k: _map(v, mounts) for k, v in spec.env.items()})
    out.pop("TENSORANT_TRAINER_USER", None)  # a user of the image, not of this host
    # SHIM_AGENT_ENV (a JSON object): what an image built with other ENV defaults would carry (small
    # self-protection bounds, a heartbeat interval, the smoke trainer's checkpoint mode). The bootstrap's
    # values still win, as they do in a real container (machine.agent.config.overlay_bootstrap).
    out.update(json.loads(os.environ.get("SHIM_AGENT_ENV") or "{}"))
    for key, value in env.items():
        if key == "TENSORANT_BOOTSTRAP":
            inner = json.loads(base64.b64decode(value))
            value = base64.b64encode(json.dumps({k: _map(v, mounts) for k, v in inner.items()}).encode()).decode()
        out[key] = _map(value, mounts)
    return out


def _entrypoint() -> list[str]:
    from tests.machine import image_spec

    command = list(image_spec().entrypoint)
    if command and command[0] in ("python", "python3"):
        command[0] = sys.executable
    return command


def _run_foreground(command: list[str], **kw: object) -> int:
    proc = subprocess.Popen(command, **kw)  # type: ignore[call-overload]

    def forward(signum: int, frame: object) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    return int(proc.wait())


def _buildah(env: dict[str, str], volumes: list[tuple[str, str]]) -> int:
    image = os.environ["SHIM_IMAGE"]
    inspected = json.loads(subprocess.run(["buildah", "inspect", "--type", "image", image], check=True,
                                          capture_output=True, text=True).stdout)
    config = inspected["OCIv1"]["config"]
    ctr = subprocess.run(["buildah", "from", "--pull-never", image], check=True, capture_output=True,
                         text=True).stdout.strip()
    try:
        command = ["buildah", "run", "--isolation", "chroot", "--workingdir", config.get("WorkingDir") or "/"]
        for key, value in env.items():
            command += ["--env", f"{key}={value}"]
        for host, container in volumes:
            command += ["-v", f"{host}:{container}"]
        return _run_foreground([*command, ctr, "--", *config["Entrypoint"], *(config.get("Cmd") or [])])
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)


def _run(args: list[str]) -> int:
    env, volumes, _image = _parse_run(args)
    mode = os.environ.get("SHIM_RUN", "agent")
    if mode == "no-gpu":
        print(NO_GPU, file=sys.stderr)
        return 125
    if mode.startswith("exit:"):
        for k in range(1, 51):
            print(f"container line {k}")
        return int(mode[5:])
    if mode == "buildah":
        return _buildah(env, volumes)
    agent_env = _agent_env(env, volumes)
    if mode == "old-driver":  # a host whose NVIDIA driver is older than the image's CUDA needs
        driver = Path(os.environ["SHIM_STATE"]) / "nvidia-driver-version"
        driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n")
        agent_env["TENSORANT_NVIDIA_DRIVER_FILE"] = str(driver)
    cwd = str(REPO)
    command = _entrypoint()
    if mode == "no-agent":
        agent_env["PYTHONPATH"] = cwd = tempfile.mkdtemp(prefix="image-without-agent-")
        command.insert(1, "-S")
    return _run_foreground(command, env=agent_env, cwd=cwd)


def main(argv: list[str]) -> int:
    _record(argv)
    if not argv:
        return 1
    if argv[0] == "pull":
        return _pull(argv[1])
    if argv[0] == "rm":
        return 0
    if argv[0] == "run":
        return _run(argv[1:])
    print(f"docker shim: {argv[0]} is not played", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main(sys.argv[1:]))
