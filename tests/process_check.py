"""`make test` leaves no process behind: a pytest plugin (pyproject's addopts: -p tests.process_check).

At the start the pytest process becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so a process
whose parent dies while a test runs (a machine's docker shim, an agent, a trainer) is re-parented here
instead of to init, where it would run on unseen. A thread reaps such orphans once they exit (never a
child a Popen object still owns: its wait() would lose the exit status). At the session's end every
descendant still alive after a short grace is listed, killed, and fails the session.

Under pytest-xdist (make test) each worker does all of this for its own tests and hands what it found to
the controller (its workeroutput), which lists every worker's and fails the session.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing.popen_fork
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 5.0  # a process that is just ending (a host's worker) gets this long
_stop = threading.Event()
_from_workers: list[str] = []  # the controller's: what each xdist worker found left running


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return int(fields[1]), fields[0]


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (got := _stat(int(entry))) is not None:
            out.setdefault(got[0], []).append(int(entry))
    return out


def descendants(root: int) -> list[int]:
    """The live (not zombie) processes under `root`."""
    tree, out, todo = _children(), [], [root]
    while todo:
        for child in tree.get(todo.pop(), []):
            todo.append(child)
            got = _stat(child)
            if got is not None and got[1] != "Z":
                out.append(child)
    return out


def _owned() -> set[int]:
    """The children a Popen object (subprocess or multiprocessing) will wait for itself."""
    pids = set()
    for obj in gc.get_objects():
        if isinstance(obj, subprocess.Popen | multiprocessing.popen_fork.Popen) and obj.returncode is None:
            pids.add(int(obj.pid))
    return pids


def _reap_orphans() -> None:
    me = os.getpid()
    while not _stop.wait(1.0):
        zombies = [pid for pid in _children().get(me, []) if (_stat(pid) or (0, ""))[1] == "Z"]
        if not zombies:
            continue
        owned = _owned()
        for pid in zombies:
            if pid not in owned:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def pytest_configure(config: pytest.Config) -> None:
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        threading.Thread(target=_reap_orphans, name="reap-orphans", daemon=True).start()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist's controller, as a worker ends: what it found left running (a crashed worker says nothing)."""
    _from_workers.extend(getattr(node, "workeroutput", {}).get("processes_left", []))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if sys.platform != "linux":
        return
    deadline = time.monotonic() + GRACE_S
    left = descendants(os.getpid())
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = descendants(os.getpid())
    _stop.set()
    lines = [f"  pid {pid}: {_cmdline(pid)[:300]}" for pid in left]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports it (its sessionfinish runs after)
        workeroutput["processes_left"] = lines
        return
    lines += _from_workers
    if not lines:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"{len(lines)} process(es) left running by the tests (killed now):\n" + "\n".join(lines)
    if reporter is not None:
        reporter.write_sep("=", "processes left behind", red=True)
        reporter.write_line(message)
    else:
        print(message, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
