"""The provider contract suite for the local provider: the "cloud" is this host's process
table and the machines directory (tests/providers/contract.py).

The agent is started for real; its API URL points at a closed port, so it keeps retrying
and stays up like an idle VM until it is signalled.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from shared.providers.local.compute import LocalCompute
from shared.providers.local.config import LocalConfig
from shared.settings import Settings
from tests.providers.contract import CloudContract, Foreign, Handed, ProviderEnv


def _processes() -> dict[int, tuple[int, str, dict[str, str]]]:
    """pid -> (process group, state letter, TENSORANT_* environment) for processes with a run id."""
    out: dict[int, tuple[int, str, dict[str, str]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            raw = Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        env = dict(item.decode().partition("=")[::2] for item in raw.split(b"\0") if item.startswith(b"TENSORANT_"))
        if "TENSORANT_RUN_ID" in env and fields[0] not in ("Z", "X"):
            out[int(entry.name)] = (int(fields[2]), fields[0], env)
    return out


def _can_pin(tmp: Path) -> bool:
    """chattr +i makes a file undeletable even for root, which delays the directory's removal."""
    probe = tmp / "pin-probe"
    probe.write_text("x")
    ok = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, check=False).returncode == 0
    if ok:
        subprocess.run(["chattr", "-i", str(probe)], check=True)
    probe.unlink()
    return ok


class TestLocalContract(CloudContract):
    @pytest.fixture
    def provider_env(self, tmp_path: Path) -> Iterator[ProviderEnv]:
        deployment = "lc" + secrets.token_hex(3)  # its own deployment: other tests' agents are never seen
        settings = Settings(deployment_id=deployment, local_root=str(tmp_path / "local"))
        provider = LocalCompute(LocalConfig(), settings)
        machines_dir = Path(settings.local_root).resolve() / "machines"
        foreign_procs: list[subprocess.Popen[bytes]] = []

        def spec(ref: RunRef) -> LaunchSpec:
            env = {"TENSORANT_RUN_ID": ref.run_id, "TENSORANT_API_URL": "http://127.0.0.1:9",
                   "TENSORANT_RUN_TOKEN": "tok-contract-" + secrets.token_hex(8)}
            return LaunchSpec(ref=ref, offer=provider.offers()[0],
                              bootstrap=Bootstrap(container_image="none", env=env,
                                                  secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"})))

        def machines(ref: RunRef) -> list[str]:
            return sorted({str(pgid) for pgid, _, env in _processes().values()
                           if env.get("TENSORANT_MANAGED") == "true" and env.get("TENSORANT_DEPLOYMENT_ID") == deployment
                           and env.get("TENSORANT_RUN_ID") == ref.run_id})

        def disks(ref: RunRef) -> list[str]:
            workdir = machines_dir / ref.name
            return [str(workdir)] if workdir.exists() else []

        def everything() -> dict[str, str]:
            # R/S/D flicker while a process works; only stopped vs not is a change made to it.
            out = {str(pid): "stopped" if state in ("T", "t") else "live" for pid, (_, state, _) in _processes().items()}
            if machines_dir.exists():
                out.update({str(p): "present" for p in machines_dir.iterdir()})
            return out

        def add_foreign(kind: Foreign, ref: RunRef) -> list[str]:
            marks = {"TENSORANT_RUN_ID": ref.run_id}
            if kind == "other-deployment":
                marks |= {"TENSORANT_MANAGED": "true", "TENSORANT_DEPLOYMENT_ID": deployment + "x",
                          "TENSORANT_ORG": ref.org}
            proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                    env={"PATH": os.environ.get("PATH", ""), **marks}, start_new_session=True)
            foreign_procs.append(proc)
            deadline = time.monotonic() + 10
            while proc.pid not in _processes():  # until the child has exec'd with its environment
                assert time.monotonic() < deadline, "the foreign process did not start"
                time.sleep(0.02)
            workdir = machines_dir / f"{kind}-{ref.name}"
            workdir.mkdir(parents=True)
            if kind == "other-deployment":
                (workdir / "marker.json").write_text(json.dumps(
                    {"deployment": deployment + "x", "org": ref.org, "run_id": ref.run_id, "name": ref.name}))
            return [str(proc.pid), str(workdir)]

        def handed(ref: RunRef) -> Handed:
            # The environment the run's agent process started with (its /proc environ); no image runs here.
            pids = [pid for pid, (pgid, _, env) in _processes().items()
                    if str(pgid) in machines(ref) and env.get("TENSORANT_RUN_ID") == ref.run_id]
            assert pids, "no agent process"
            raw = Path(f"/proc/{min(pids)}/environ").read_bytes()
            return Handed(env=dict(item.decode().partition("=")[::2] for item in raw.split(b"\0") if item))

        @contextmanager
        def slow_release() -> Iterator[None]:
            pinned = machines_dir / provider_env_ref.name / "data" / "pinned"
            pinned.write_text("x")
            subprocess.run(["chattr", "+i", str(pinned)], check=True)
            try:
                yield
            finally:
                subprocess.run(["chattr", "-i", str(pinned)], check=True)

        provider_env_ref = RunRef(deployment, "org-1", "run-c1")
        try:
            yield ProviderEnv(
                provider=provider, ref=provider_env_ref, spec=spec, machines=machines, disks=disks,
                everything=everything, add_foreign=add_foreign, page_size=2, handed=handed,
                list_requests=None,  # the process table is read whole
                slow_release=slow_release if _can_pin(tmp_path) else None)
        finally:
            for res in list(provider.list_managed()):
                provider.release(RunRef(deployment, res.org or "org-1", res.run_id), [])
            for proc in foreign_procs:
                proc.kill()
                proc.wait()
