"""The checks run when a local compute connection is saved: a writable machine root, a
process table (/proc), an agent that imports, and which trainer runs.

Their messages go to the org's owner through the API, so none names a path of the control
plane's host (the machines directory, the interpreter, the repository, a traceback's files):
each says which setting or step to fix, and the details go to the control plane's log.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

from shared.log import get_logger
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
                            message="can create machine directories under TENSORANT_LOCAL_ROOT"))
    except OSError as exc:
        # strerror ("Permission denied") carries no path; str(exc) would name the file.
        checks.append(Check(name="work_root", status=CheckStatus.fail,
                            message=f"cannot create machine directories under TENSORANT_LOCAL_ROOT "
                                    f"({exc.strerror or type(exc).__name__}); the operator sets "
                                    "TENSORANT_LOCAL_ROOT to a directory the control plane can write"))
    if not Path("/proc/self/environ").exists():
        checks.append(Check(name="process_table", status=CheckStatus.fail,
                            message="no /proc here; the local provider runs only on Linux"))
    probe_env = {k: os.environ[k] for k in INHERITED if k in os.environ} | {"PYTHONPATH": str(repo_root)}
    # cwd: a `-c` program imports from its working directory first; the agent is the repository's.
    result = subprocess.run([sys.executable, "-c", "import machine.agent.main, machine.trainer.smoke"],
                            env=probe_env, cwd=repo_root, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode == 0:
        checks.append(Check(name="agent", status=CheckStatus.ok, message="the agent module imports"))
    else:
        get_logger().warning("local check: the agent does not import", extra={"stderr": result.stderr[-2000:]})
        checks.append(Check(name="agent", status=CheckStatus.fail,
                            message=f"the agent does not import ({import_error(result.stderr)}); install the "
                                    "project's dependencies (the control plane's log has the traceback)"))
    # Which trainer, not its command line: that holds the interpreter's path on this host.
    if "machine.trainer.smoke" in trainer_command:
        checks.append(Check(name="trainer", status=CheckStatus.warn,
                            message="runs use the smoke trainer (TENSORANT_TRAINER_COMMAND), which trains nothing "
                                    "and writes a random adapter"))
    elif "shared.providers.local.trainer" in trainer_command:
        checks.append(Check(name="trainer", status=CheckStatus.ok,
                            message="runs use the real LoRA trainer on this host's CPU (models up to 1B parameters, "
                                    "no hub access)"))
    else:
        checks.append(Check(name="trainer", status=CheckStatus.ok,
                            message="runs use the operator's trainer command (TENSORANT_TRAINER_COMMAND)"))
    return checks


def import_error(stderr: str) -> str:
    """What failed to import, from a traceback, without its file paths: the missing module's name, or
    else the exception's type."""
    missing = re.search(r"No module named '([\w.]+)'", stderr)
    if missing:
        return f"no module named {missing.group(1)!r}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    kind = re.match(r"([A-Za-z_][\w.]*(?:Error|Exception))\b", lines[-1]) if lines else None
    return kind.group(1) if kind else "it failed"
