"""How long the VM check waits for a booting VM to reach cloud-init, derived from the machine's speed now.

The fixed 300 s came within 70 s of calling a healthy VM broken at load 40 (issue 41.17): the emulated VM
boots as fast as its host gives it CPU. So the limit is BASE_S on an idle reference machine, times how much
slower a fixed piece of work runs here and now: its CPU time against the reference (a slower CPU) times its
wall time against its CPU time (the CPU shared with other processes), capped at the case's own timeout.
"""

from __future__ import annotations

import hashlib
import time

BASE_S = 300.0  # cloud-init's first stage came at 46-84 s of uptime on an idle machine
# CPU seconds of `work()` on the reference machine (the development host: 0.151-0.153 s in three runs).
REFERENCE_CPU_S = 0.15
WORK_MIB = 256


def work() -> None:
    chunk = b"x" * (1 << 20)
    digest = hashlib.sha256()
    for _ in range(WORK_MIB):
        digest.update(chunk)


def measure() -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `work()` now."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def boot_limit_s(wall_s: float, cpu_s: float, *, ceiling_s: float, base_s: float = BASE_S,
                 reference_cpu_s: float = REFERENCE_CPU_S) -> float:
    """BASE_S scaled by the measured slowdown (never below BASE_S, never above ceiling_s)."""
    cpu_s = max(cpu_s, 1e-6)
    slower_cpu = max(1.0, cpu_s / reference_cpu_s)
    shared_cpu = max(1.0, wall_s / cpu_s)
    return min(ceiling_s, max(base_s, base_s * slower_cpu * shared_cpu))
