"""The checks run when a local compute connection is saved: a writable machine root, a
process table (/proc), an agent that imports, and which trainer runs."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from shared.models import Check, CheckStatus

# Environment a probe (and the agent) inherits: what a process needs to run, no secrets.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")


def run_checks(machines: Path, trainer_command: str, repo_root: Path) -> list[Check]:
    checks: list[Check] = []
    try:
        machines.mkdir(parents=True, exist_ok=True)
        probe = machines / f".probe-{secrets.token_hex(4)}"
        probe.write_text("probe")
        probe.unlink()
        checks.append(Check(name="work_root", status=CheckStatus.ok,
                            message=f"can create machine directories in {machines}"))
    except OSError as exc:
        checks.append(Check(name="work_root", status=CheckStatus.fail,
                            message=f"cannot write in {machines} ({exc}); set TENSORANT_LOCAL_ROOT to a "
                                    "directory the control plane can write"))
    if not Path("/proc/self/environ").exists():
        checks.append(Check(name="process_table", status=CheckStatus.fail,
                            message="no /proc here; the local provider runs only on Linux"))
    probe_env = {k: os.environ[k] for k in INHERITED if k in os.environ} | {"PYTHONPATH": str(repo_root)}
    result = subprocess.run([sys.executable, "-c", "import shared.agent.main, shared.trainer.smoke"],
                            env=probe_env, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode == 0:
        checks.append(Check(name="agent", status=CheckStatus.ok, message="the agent module imports"))
    else:
        checks.append(Check(name="agent", status=CheckStatus.fail,
                            message=f"the agent does not import ({result.stderr.strip()[-300:]}); "
                                    "install the project's dependencies"))
    if "shared.trainer.smoke" not in trainer_command:
        checks.append(Check(name="trainer", status=CheckStatus.ok,
                            message=f"runs use the trainer command {trainer_command!r} (by default the real LoRA "
                                    "trainer on this host's CPU: models up to 1B parameters, no hub access)"))
    else:
        checks.append(Check(name="trainer", status=CheckStatus.warn,
                            message=f"runs use the smoke trainer ({trainer_command!r}), which trains nothing "
                                    "and writes a random adapter"))
    return checks
