"""A launch retried after a crash bills from the cloud's own creation time of the machine it finds,
not from the retry's create call (issue 29.9: the retry came 60 s after the instance's LaunchTime)."""

from __future__ import annotations

from typing import Any

from shared.store import get_store
from shared.store.ledger import Ledger
from tests.fakes import Cloud
from tests.harness import Harness


def test_a_launch_retried_after_a_crash_bills_from_the_machines_creation(harness: Harness, cloud: Cloud,
                                                                         monkeypatch: Any) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    real = Ledger.record
    crashes = [1]

    def crash_once(self: Ledger, res: Any) -> None:
        if crashes:
            crashes.pop()
            raise RuntimeError("the host died after the cloud created the machine")
        real(self, res)

    monkeypatch.setattr(Ledger, "record", crash_once)
    harness.ok("POST", f"/api/runs/{run_id}/launch", json_body={"confirm": True})
    created = harness.clock.t
    harness.drain()  # the launch step dies after the cloud call
    harness.clock.advance(61)  # the message comes back after the host's retry (and the launch claim's settle time)
    harness.drain()
    run = get_store().runs.get(harness.org, run_id)[0]
    assert run.resources and run.machine_up_at is not None
    assert abs(run.machine_up_at.timestamp() - created) < 0.001, (run.machine_up_at.timestamp(), created)
