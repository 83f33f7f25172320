"""What a retained machine is kept for, and how long (issue 29.4): a run whose machine holds nothing
recoverable is released, not retained; a retained run is warned, then discarded at its org's retention
limit, with events at each point (shared/runs/retention.py, heartbeat-check, the retain step)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.context import Context
from shared.runs import org_limits
from shared.services.timers import heartbeat_check
from shared.settings import get_settings
from tests.fakes import Cloud
from tests.harness import Harness

DAY = 24 * 3600


def _events(run: dict[str, Any], kind: str) -> list[str]:
    return [e["message"] for e in run["events"] if e["kind"] == kind]


def test_a_machine_that_reports_once_then_dies_while_preparing_is_released_not_kept(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=DAY)
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("preparing")  # its one report; then the machine dies
    harness.serve(get_settings().heartbeat_timeout_s + 120)
    run = harness.get_run(run_id)
    # Before: retained, the disk billed for ever (604,800 s in a simulated week). Nothing was trained.
    assert run["state"] == "failed", run
    assert "heartbeat went silent" in run["reason"] and "nothing had been trained" in run["reason"], run["reason"]
    assert "no checkpoint or output of it was saved" in run["reason"], run["reason"]
    [m] = cloud.machines.values()
    assert m.state == "terminated" and not m.disk_exists and not cloud.live()
    assert run["billed_disk_only_s"] == 0.0 and run["final_cost"] is not None
    walked = {m.split(":")[0] for m in _events(run, "transition")}
    assert {"preparing -> retaining", "retaining -> releasing", "releasing -> failed"} <= walked, walked
    assert "retaining -> retained" not in walked


def test_a_silent_preparing_run_whose_checkpoint_reached_storage_is_kept(harness: Harness, cloud: Cloud) -> None:
    # The agent trained on without reaching the control plane and uploaded a checkpoint's adapter to storage.
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=DAY)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("preparing")
    agent.upload(b"the adapter of the checkpoint at step 50")
    harness.serve(get_settings().heartbeat_timeout_s + 120)
    run = harness.get_run(run_id)
    assert run["state"] == "retained", run
    [m] = cloud.machines.values()
    assert m.state == "stopped" and m.disk_exists


def test_storage_that_cannot_answer_keeps_the_disk(harness: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    from shared.org_storage.local import LocalStorage

    def unreachable(self: Any, key: str, max_bytes: int) -> Any:
        raise OSError("storage account unreachable")

    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=DAY)
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("preparing")
    monkeypatch.setattr(LocalStorage, "open_stream", unreachable)
    harness.serve(get_settings().heartbeat_timeout_s + 120)
    run = harness.get_run(run_id)
    assert run["state"] == "retained", run  # a release cannot be undone: unknown is kept
    assert any("storage could not say" in w for w in _events(run, "warning"))


def _retained(harness: Harness) -> str:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.4)
    agent.complete_failed("boom")  # output may exist: retained
    assert harness.get_run(run_id)["state"] == "retained"
    return run_id


def test_a_retained_run_is_warned_then_discarded_at_the_retention_limit(harness: Harness, cloud: Cloud) -> None:
    assert harness.ok("GET", "/api/org/limits")["retention_limit_s"] == 14 * DAY  # the stated default
    run_id = _retained(harness)
    assert any("kept until" in w and "14 days" in w for w in harness.get_run(run_id)["warnings"])

    harness.clock.advance(12 * DAY - 60)
    assert heartbeat_check.check_all(harness.ctx)["retention_warned"] == 0
    harness.clock.advance(120)  # past the warning point: 2 days before the limit
    assert heartbeat_check.check_all(harness.ctx)["retention_warned"] == 1
    assert heartbeat_check.check_all(harness.ctx)["retention_warned"] == 0  # once, not every minute
    run = harness.get_run(run_id)
    [warning] = [w for w in _events(run, "warning") if "will be discarded" in w]
    assert "retention limit of 14 days" in warning and "recover it before then" in warning
    assert run["state"] == "retained"

    harness.served(2 * DAY)  # served all along: the same clock counted the warning down
    counts = heartbeat_check.check_all(harness.ctx)
    assert counts["discarded"] == 1, counts
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "failed" and run["reason"].startswith("discarded: retained for the organization's "
                                                                 "retention limit of 14 days"), run["reason"]
    assert "boom" in run["reason"]  # why it was retained, kept in the reason
    assert not cloud.live()
    walked = {m.split(":")[0] for m in _events(run, "transition")}
    assert {"retained -> releasing", "releasing -> failed"} <= walked, walked
    # A week and more of disk billing, then nothing: the release is confirmed.
    assert run["billed_disk_only_s"] == pytest.approx(14 * DAY, abs=120)


def test_the_retention_limit_is_an_org_setting_read_once_per_tick(harness: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    status, body, _ = harness.call("PUT", "/api/org/limits", json_body={"retention_limit_s": 3600})
    assert status == 422 and "retention_limit_s" in str(body), body
    harness.ok("PUT", "/api/org/limits", json_body={"retention_limit_s": 2 * DAY})
    runs = [_retained(harness) for _ in range(2)]
    reads: list[str] = []

    def counted(ctx: Context, org: str) -> org_limits.OrgLimits:
        reads.append(org)
        return org_limits.get_limits(ctx, org)

    monkeypatch.setattr(heartbeat_check, "get_limits", counted)
    harness.clock.advance(DAY + 60)  # a limit under 4 days: warned half-way
    assert heartbeat_check.check_all(harness.ctx)["retention_warned"] == 2
    assert reads == [harness.org]  # one read for the org's two retained runs in one tick
    harness.served(DAY)
    assert heartbeat_check.check_all(harness.ctx)["discarded"] == 2
    harness.drain()
    assert [harness.get_run(r)["state"] for r in runs] == ["failed", "failed"]


def test_a_recovery_started_before_the_limit_is_not_discarded(harness: Harness, cloud: Cloud) -> None:
    from tests.harness import smoke_adapter_zip

    run_id = _retained(harness)
    harness.clock.advance(13 * DAY)
    heartbeat_check.check_all(harness.ctx)
    run = harness.recover(run_id, upload=smoke_adapter_zip())
    assert run["state"] == "succeeded" and run["adapter_kind"] == "final", run
    harness.served(2 * DAY)
    assert heartbeat_check.check_all(harness.ctx)["discarded"] == 0
