"""A machine whose NVIDIA driver is older than the image's CUDA needs, played by tests/machine.py: the
agent reports the failed start before its first heartbeat (machine/agent/gpu.py), and the run ends
failed and released within minutes, its reason naming the driver and what to do; never a run that
trains on the CPU until its runtime limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.boot import BootHarness, finish
from tests.e2e.test_bootstrap_e2e import _aws_launch, _state
from tests.machine import Machine, wait_for

pytestmark = pytest.mark.e2e


def test_aws_driver_too_old_is_a_boot_failure_released_in_minutes(boot_aws_h: tuple[BootHarness, Any],
                                                                  tmp_path: Path) -> None:
    h, ec2 = boot_aws_h
    run_id, instance, user_data = _aws_launch(h, ec2)
    machine = Machine(tmp_path / "vm", h.clock, run="old-driver")
    machine.boot(user_data)
    wait_for(lambda: machine.exited() is not None, "the bootstrap script to end", machine=machine)
    run = finish(h, run_id, machine)
    assert run["state"] == "failed", f"{run['reason']}\n{h.step_errors}\n{machine.console()[-3000:]}"
    reason = run["reason"]
    assert "agent exited before it reported" in reason and "exit code 4" in reason, reason
    assert "535.104.05" in reason and "580.65.06" in reason and "released" in reason, reason
    assert _state(ec2, instance) == "terminated"
    # Nothing was trained: no heartbeat ever moved the run past provisioning.
    assert not any(e.get("message", "").startswith("preparing") for e in run.get("events") or [])
    assert run["billed_machine_s"] <= 60, run["billed_machine_s"]
