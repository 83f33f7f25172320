"""The VM check's boot limit follows the machine's speed (tests/e2e/boot_limit.py, issue 41.17): the fixed 300 s
came within 70 s of calling a healthy VM broken at load 40."""

from __future__ import annotations

from tests.e2e.boot_limit import BASE_S, REFERENCE_CPU_S, boot_limit_s, measure

CEILING = 1500.0


def test_an_idle_reference_machine_keeps_the_base_limit() -> None:
    assert boot_limit_s(REFERENCE_CPU_S, REFERENCE_CPU_S, ceiling_s=CEILING) == BASE_S
    assert boot_limit_s(REFERENCE_CPU_S / 2, REFERENCE_CPU_S / 2, ceiling_s=CEILING) == BASE_S  # never below


def test_a_shared_cpu_and_a_slower_cpu_widen_it() -> None:
    # Four processes per CPU: the work's wall time is four times its CPU time.
    assert boot_limit_s(4 * REFERENCE_CPU_S, REFERENCE_CPU_S, ceiling_s=CEILING) == 4 * BASE_S
    # A CPU half as fast, alone.
    assert boot_limit_s(2 * REFERENCE_CPU_S, 2 * REFERENCE_CPU_S, ceiling_s=CEILING) == 2 * BASE_S
    # Both at once multiply, up to the case's own timeout.
    assert boot_limit_s(6 * REFERENCE_CPU_S, 2 * REFERENCE_CPU_S, ceiling_s=CEILING) == CEILING


def test_a_busier_measurement_never_gives_a_shorter_limit() -> None:
    limits = [boot_limit_s(REFERENCE_CPU_S * f, REFERENCE_CPU_S, ceiling_s=CEILING) for f in (1, 1.5, 2, 3, 5, 9)]
    assert limits == sorted(limits) and limits[-1] == CEILING


def test_the_measurement_is_of_real_work() -> None:
    wall, cpu = measure()
    assert cpu > 0 and wall >= cpu * 0.5
    limit = boot_limit_s(wall, cpu, ceiling_s=CEILING)
    assert BASE_S <= limit <= CEILING
