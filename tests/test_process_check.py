"""The session-end check (tests/process_check.py) fails a suite that leaves a process behind, orphans included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _suite(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.process_check",
                           "-o", "addopts=", *args, "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_an_orphan_left_running_fails_the_session(tmp_path: Path) -> None:
    # The shell exits at once; its background sleep is re-parented: an orphan, as a dead machine's agent was.
    done = _suite(tmp_path, """
        import subprocess
        def test_leaves_an_orphan():
            subprocess.run(["sh", "-c", "exec 0<&- 1>&- 2>&-; sleep 300 &"], check=True)
    """)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "left running by the tests" in done.stdout and "sleep 300" in done.stdout


def test_a_suite_that_ends_its_processes_passes(tmp_path: Path) -> None:
    done = _suite(tmp_path, """
        import subprocess
        def test_waits_for_its_child():
            proc = subprocess.Popen(["sleep", "0.2"])
            assert proc.wait() == 0  # the reaper never takes a child its Popen still owns
    """)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left running" not in done.stdout


def test_in_worker_processes_what_any_worker_leaves_fails_the_session(tmp_path: Path) -> None:
    """make test runs the suite in two xdist workers: each finds what its tests left (an orphan, a child still
    running) and the controller lists both and fails the session (the workers themselves are not listed)."""
    done = _suite(tmp_path, """
        import subprocess
        def test_leaves_an_orphan():
            subprocess.run(["sh", "-c", "exec 0<&- 1>&- 2>&-; sleep 301 &"], check=True)
        def test_leaves_its_child():
            subprocess.Popen(["sleep", "302"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        def test_fine():
            pass
    """, "-n", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "3 passed" in done.stdout and "2 process(es) left running" in done.stdout, done.stdout
    assert "sleep 301" in done.stdout and "sleep 302" in done.stdout


def test_in_worker_processes_a_suite_that_ends_its_processes_passes(tmp_path: Path) -> None:
    done = _suite(tmp_path, """
        import subprocess
        def test_waits_for_its_child():
            assert subprocess.run(["sleep", "0.2"]).returncode == 0
        def test_other():
            pass
    """, "-n", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout and "left running" not in done.stdout


def test_a_powered_off_machine_ends_its_whole_process_group(tmp_path: Path) -> None:
    """tests/machine.Machine.power_off: the shell ends at SIGTERM, a process under it that ignores SIGTERM
    (the docker shim's agent, once) is killed too, not left running after the test."""
    from tests.machine import LedgerClock, Machine

    machine = Machine(tmp_path / "vm", LedgerClock(0.0, tmp_path / "ledger"))
    pid_file = tmp_path / "stubborn.pid"
    stubborn = (f"{sys.executable} -c 'import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                f"open(\"{pid_file}\", \"w\").write(str(os.getpid())); time.sleep(300)'")
    machine._start(["sh", "-c", f"{stubborn} & wait"])
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        subprocess.run(["sleep", "0.05"])  # the child's start is a real process's, not the simulated clock's
    pid = int(pid_file.read_text())
    machine.power_off(grace_s=0.5)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "the stubborn child survived"
