"""`systemctl` on a machine played by tests/machine.py, and the systemd that starts its units at boot.

As `systemctl` (first on the machine's PATH; cloud-init's runcmd calls it):
- `daemon-reload`: every unit file under the sandbox's /etc/systemd/system is read; one this shim
  cannot play (a key it does not know, Restart= other than no, no ExecStart) fails here, as
  `systemd-analyze verify` would warn, so a bootstrap that needs more than is played is noticed.
- `enable UNIT`: linked into the .wants folder of its [Install] WantedBy target, as systemctl does;
  a unit without an [Install] section is not enabled (systemctl says so and does nothing).
- `start [--no-block] UNIT`: a start job, queued; it runs once cloud-init's runcmd is done.
Anything else is refused.

As systemd (`python tests/systemd_shim.py boot first|again`, run by Machine.boot and boot_again):
the first boot runs the start jobs runcmd queued; a later boot (the cloud started the stopped machine
again) runs the units enabled for multi-user.target. A unit runs the way systemd runs a simple
service: ExecStart in the foreground with the manager's environment (no HOME, no LANG; PATH and the
shims' SHIM_* variables), its output to the machine's console (standing for the journal), then
ExecStopPost. The exit code is ExecStart's. Not played: ExecStop (Machine.power_off is a hard stop:
everything on the machine ends at once), ordering (units run one after another, after runcmd).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

KNOWN = {
    "Unit": {"Description", "Documentation", "Wants", "After", "Requires", "Before"},
    "Service": {"Type", "ExecStart", "ExecStop", "ExecStopPost", "Restart", "StandardOutput", "StandardError",
                "TimeoutStopSec", "SuccessExitStatus", "KillMode", "SyslogIdentifier", "Environment"},
    "Install": {"WantedBy"},
}
BOOT_TARGET = "multi-user.target"


def _root() -> Path:
    return Path(os.environ["SHIM_ROOT"])  # the sandbox folder standing for the machine's /


def _units() -> Path:
    return _root() / "etc/systemd/system"


def _jobs() -> Path:
    return Path(os.environ["SHIM_STATE"]) / "systemd-jobs"


def _record(args: list[str]) -> None:
    with open(Path(os.environ["SHIM_STATE"]) / "systemctl-calls.jsonl", "a") as f:
        f.write(json.dumps(args) + "\n")


class Refused(Exception):
    pass


def parse(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A unit file's sections as (key, value) lists, repeated keys kept (systemd's syntax: # and ;
    comments, a trailing backslash continues the line)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    text = path.read_text().replace("\\\n", " ")
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            if current not in KNOWN:
                raise Refused(f"{path.name}:{number}: section [{current}] is not played here")
            sections.setdefault(current, [])
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not current:
            raise Refused(f"{path.name}:{number}: not a key=value line in a section: {raw!r}")
        if key not in KNOWN[current]:
            raise Refused(f"{path.name}:{number}: {key}= in [{current}] is not played here")
        sections[current].append((key, value))
    service = dict(sections.get("Service", []))
    if service.get("Type", "simple") not in ("simple", "exec"):
        raise Refused(f"{path.name}: Type={service['Type']} is not played here (simple or exec)")
    if service.get("Restart", "no") != "no":
        raise Refused(f"{path.name}: Restart={service['Restart']} is not played here")
    if [k for k, _ in sections.get("Service", [])].count("ExecStart") != 1:
        raise Refused(f"{path.name}: a simple service has exactly one ExecStart=")
    return sections


def _one(sections: dict[str, list[tuple[str, str]]], section: str, key: str) -> str | None:
    values = [v for k, v in sections.get(section, []) if k == key]
    return values[-1] if values else None


def _unit(name: str) -> Path:
    path = _units() / name
    if "/" in name or not name.endswith(".service") or not path.is_file():
        raise Refused(f"Unit {name} not found.")
    return path


def _command(line: str) -> list[str]:
    """An Exec line as argv (a "-" prefix, failure ignored, is dropped: nothing here acts on a failure)."""
    argv = shlex.split(line[1:] if line.startswith("-") else line)
    if not argv or not argv[0].startswith("/"):
        raise Refused(f"Exec line {line!r}: the command must be an absolute path (prefixes other than - not played)")
    return argv


def systemctl(args: list[str]) -> int:
    _record(args)
    # --no-block: the start job is queued either way (below); a simple service counts as started once forked.
    words = [a for a in args if a != "--no-block"]
    if any(w.startswith("-") for w in words):
        raise Refused(f"systemctl shim: options {[w for w in words if w.startswith('-')]} are not played")
    if words == ["daemon-reload"]:
        for path in sorted(_units().glob("*.service")) if _units().is_dir() else []:
            parse(path)
        return 0
    if len(words) == 2 and words[0] == "enable":
        path = _unit(words[1])
        targets = [t for k, v in parse(path).get("Install", []) if k == "WantedBy" for t in v.split()]
        if not targets:
            print(f"The unit files have no installation config (WantedBy=...); {words[1]} is not enabled.",
                  file=sys.stderr)
            return 0
        for target in targets:
            wants = _units() / f"{target}.wants"
            wants.mkdir(parents=True, exist_ok=True)
            link = wants / words[1]
            if not link.is_symlink():
                link.symlink_to(path)
                print(f"Created symlink {link} -> {path}.", file=sys.stderr)
        return 0
    if len(words) == 2 and words[0] == "start":
        parse(_unit(words[1]))
        # Played as queued: cloud-init's runcmd goes on at once, the unit runs when runcmd is done.
        with open(_jobs(), "a") as f:
            f.write(words[1] + "\n")
        return 0
    raise Refused(f"systemctl shim: {' '.join(args)} is not played")


def _environment(sections: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    """The service manager's environment: what the machine's own PATH holds (its shims first), the shims'
    settings, and the unit's Environment= lines. No HOME, no LANG: systemd gives a service neither."""
    env = {"PATH": os.environ["PATH"], **{k: v for k, v in os.environ.items() if k.startswith("SHIM_")}}
    for key, value in sections.get("Service", []):
        if key == "Environment":
            for item in shlex.split(value):
                name, _, val = item.partition("=")
                env[name] = val
    return env


def _run_unit(name: str) -> int:
    sections = parse(_unit(name))
    env = _environment(sections)
    start = _command(_one(sections, "Service", "ExecStart") or "")
    done = subprocess.run(start, env=env, cwd=_root(), stdin=subprocess.DEVNULL)
    code = done.returncode if done.returncode >= 0 else 128 - done.returncode
    post = [v for k, v in sections["Service"] if k == "ExecStopPost"]
    for line in post:
        result = "success" if code == 0 else "exit-code"
        subprocess.run(_command(line), env={**env, "SERVICE_RESULT": result, "EXIT_CODE": "exited", "EXIT_STATUS": str(code)},
                       cwd=_root(), stdin=subprocess.DEVNULL)
    return code


def boot(which: str) -> int:
    """systemd at boot: the queued start jobs (first boot, after runcmd) or the enabled units (a later boot)."""
    if which == "first":
        names = _jobs().read_text().split() if _jobs().exists() else []
        _jobs().unlink(missing_ok=True)
    else:
        wants = _units() / f"{BOOT_TARGET}.wants"
        names = sorted(p.name for p in wants.iterdir()) if wants.is_dir() else []
    code = 0
    for name in dict.fromkeys(names):  # a unit started twice runs once
        code = _run_unit(name)
    return code


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        if argv[:1] == ["boot"] and len(argv) == 2 and argv[1] in ("first", "again"):
            return boot(argv[1])
        return systemctl(argv)
    except Refused as exc:
        print(exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
