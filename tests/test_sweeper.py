"""The sweeper through its HTTP handler and timer: grace, marks, leaks, stuck releases, audit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from shared.clock import now
from shared.providers.base import ComputeProvider, RunRef
from shared.runs.org_backends import compute_of
from shared.services.steps import sweep_account
from shared.settings import get_settings
from shared.store import leases
from tests.chaos.fixtures import audits, sweep
from tests.chaos.provider import ChaosCloud, ChaosCompute
from tests.fakes import Cloud, serve_memory
from tests.harness import Harness, smoke_adapter_zip


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """`cloud`, and so `harness`, on the chaos provider: its faults on demand (tests/chaos/provider.py)."""
    yield from serve_memory(ChaosCloud(), ChaosCompute)


def finished_run(harness: Harness) -> str:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).train(smoke_adapter_zip())
    assert harness.get_run(run_id)["state"] == "succeeded"
    return run_id


def grace() -> int:
    return get_settings().sweep_grace_s


def test_late_machine_of_a_finished_run_is_released_after_grace(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = finished_run(harness)
    ref = RunRef(get_settings().deployment_id, harness.org, run_id)
    late = cloud.add_foreign(ref.tags, now())
    assert not sweep(harness)["findings"]  # younger than the grace period
    harness.clock.advance(grace() + 1)
    dry = sweep(harness, dry_run=True)
    assert [f["action"] for f in dry["findings"]] == ["would release"]
    assert dry["findings"][0]["run_id"] == run_id and "succeeded" in dry["findings"][0]["reason"]
    assert late.state == "running"  # a dry run changes nothing
    assert audits("sweep-dry-run")[0]["resources"] == [f"instance:{late.id}", f"volume:{late.disk_id}"]
    out = sweep(harness)
    # One account: listed once, and only the run its resources name read (not the org's history).
    assert out["findings"][0]["done"] is True and out["accounts"] == 1 and out["runs_read"] == 1
    assert late.state == "terminated" and not late.disk_exists
    [a] = audits("sweep-release")
    assert a["run_id"] == run_id and a["reason"] and a["resources"]
    assert not sweep(harness)["findings"]


def test_never_touches_what_is_not_ours(harness: Harness, cloud: ChaosCloud) -> None:
    from shared.clock import now

    d = get_settings().deployment_id
    other_dep = cloud.add_foreign(RunRef("prod-other", harness.org, "r-x").tags, now())
    other_org = cloud.add_foreign(RunRef(d, "org-b", "r-y").tags, now())
    unmanaged = cloud.add_foreign({**RunRef(d, harness.org, "r-z").tags, "tensorant:managed": "false"}, now())
    no_tags = cloud.add_foreign({}, now())
    ghost = cloud.add_foreign(RunRef(d, harness.org, "r-ghost").tags, now())  # ours, run missing
    harness.clock.advance(grace() + 1)
    out = sweep(harness)
    assert [(f["run_id"], f["reason"]) for f in out["findings"]] == [("r-ghost", "its run is missing")]
    assert ghost.state == "terminated"
    for m in (other_dep, other_org, unmanaged, no_tags):
        assert m.state == "running" and m.disk_exists


def test_live_and_retained_runs_keep_their_machines(harness: Harness, cloud: ChaosCloud) -> None:
    live = harness.create_run("memory", "mem-a10")
    harness.launch(live)
    agent = harness.agent(live)  # minted now: a token minted at a simulated future time is not yet valid
    agent.heartbeat("training", 0.2)
    kept = harness.create_run("memory", "mem-a10")
    harness.launch(kept)
    harness.agent(kept).complete_failed("boom")
    assert harness.get_run(kept)["state"] == "retained"
    harness.clock.advance(grace() + 1)
    agent.heartbeat("training", 0.3)
    assert not sweep(harness)["findings"]
    assert len(cloud.live()) == 2 and all(m.disk_exists for m in cloud.live())


def test_stuck_release_is_resent_with_backoff_and_error_shown(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    cloud.always["release"] = RuntimeError("API gateway crashed")  # not a provider error: the step dies
    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": True})
    harness.drain()  # five failed deliveries: the message is poisoned, the run stuck in releasing
    assert harness.get_run(run_id)["state"] == "releasing"
    assert not sweep(harness)["findings"]  # just entered releasing: within grace
    harness.clock.advance(grace() + 1)
    [f] = sweep(harness)["findings"]
    assert f["action"] == "re-send release" and f["attempt"] == 1
    run = harness.get_run(run_id)
    assert run["release_attempts"] == 1 and "not confirmed" in run["release_error"]
    assert not sweep(harness)["findings"]  # not due yet
    harness.drain()
    delays = []
    for _ in range(3):
        before = harness.get_run(run_id)["release_attempts"]
        harness.clock.advance(3600)
        [f] = sweep(harness)["findings"]
        delays.append(f["next_in_s"])
        assert harness.get_run(run_id)["release_attempts"] == before + 1
        harness.drain()
    assert delays[0] < delays[1] < delays[2] <= get_settings().release_backoff_max_s
    del cloud.always["release"]
    harness.clock.advance(3600)
    sweep(harness)
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "cancelled" and not cloud.live() and run["release_error"] == ""
    assert audits("sweep-release-retry")


def test_machine_deleted_outside_fails_the_run_with_nothing_to_release(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.4)
    [m] = cloud.machines.values()
    m.state, m.disk_exists = "terminated", False  # someone deleted it in the console
    harness.clock.advance(grace() + 1)
    [f] = sweep(harness, dry_run=True)["findings"]
    assert f["action"] == "would retain" and harness.get_run(run_id)["state"] == "training"
    [f] = sweep(harness)["findings"]
    assert f["action"] == "retain"
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "failed"
    assert "nothing to retain or release" in run["reason"] and "deleted outside" in run["reason"]


def test_listing_failure_is_reported_not_fatal(harness: Harness, cloud: ChaosCloud) -> None:
    from shared.errors import AuthError

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).complete_failed("oom")
    assert harness.get_run(run_id)["state"] == "retained"
    cloud.always["list"] = AuthError("credentials expired")
    out = sweep(harness)
    assert "credentials expired" in out["findings"][0]["reason"]
    assert audits("sweep-list-failed")
    # A key that stops working while a run is retained is reported, not silently ignored.
    conn = harness.ok("GET", "/api/connections/compute/memory")
    assert conn["status"] == "failed" and conn["checks"][0]["name"] == "credentials"
    warnings = [e["message"] for e in harness.get_run(run_id)["events"] if e["kind"] == "warning"]
    assert any("credentials no longer work" in w for w in warnings)


def test_timer_runs_the_sweeper(harness: Harness, cloud: ChaosCloud) -> None:
    from shared.clock import now

    ghost = cloud.add_foreign(RunRef(get_settings().deployment_id, harness.org, "r-ghost").tags, now())
    harness.clock.advance(grace() + 1)
    harness.tick("sweeper")
    assert ghost.state == "running"  # the timer only sends one message per account...
    harness.drain()
    assert ghost.state == "terminated"  # ...whose step sweeps it


def test_a_listing_that_misses_a_live_machine_stops_nothing(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.4)
    harness.clock.advance(grace() + 1)
    agent.heartbeat("training", 0.5)
    cloud.visible_at = {m: float("inf") for m in cloud.machines}  # the listing misses it; describe finds it
    assert not sweep(harness)["findings"]
    assert harness.get_run(run_id)["state"] == "training"
    assert [m.state for m in cloud.machines.values()] == ["running"]


def test_two_sweeps_at_once_release_a_leak_once_with_one_audit_entry(harness: Harness, cloud: ChaosCloud) -> None:
    ghost = cloud.add_foreign(RunRef(get_settings().deployment_id, harness.org, "r-ghost").tags, now())
    harness.clock.advance(grace() + 1)
    # Two sweeps of one account at once (two deliveries on two hosts, or the timer's and an admin's):
    # each waits after its listing for the other, unless the other has ended (skipped) meanwhile.
    met = threading.Barrier(2)

    class Meets:
        def __init__(self, provider: ComputeProvider) -> None:
            self.provider = provider

        def __getattr__(self, name: str) -> Any:
            return getattr(self.provider, name)

        def list_managed(self) -> Any:
            listed = list(self.provider.list_managed())
            try:
                met.wait(timeout=30)
            except threading.BrokenBarrierError:
                pass  # the other sweep has ended without listing
            return listed

    results: list[dict[str, Any]] = []

    def run(sweep_id: str) -> None:
        try:
            results.append(sweep_account.sweep_one(
                harness.ctx, harness.org, "memory", sweep_id=sweep_id, dry_run=False,
                compute=lambda rec: cast(ComputeProvider, Meets(compute_of(harness.ctx, rec)))))
        finally:
            met.abort()

    threads = [threading.Thread(target=run, args=(f"s20260101000000-00000{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert ghost.state == "terminated"
    assert cloud.calls.count("release") == 1
    assert len(audits("sweep-release")) == 1
    assert sorted(len(r["findings"]) for r in results) == [0, 1]
    assert [bool(r.get("skipped")) for r in results].count(True) == 1


def test_a_dead_sweepers_lease_runs_out_for_its_account_alone(harness: Harness, cloud: ChaosCloud) -> None:
    ghost = cloud.add_foreign(RunRef(get_settings().deployment_id, harness.org, "r-ghost").tags, now())
    harness.clock.advance(grace() + 1)
    # A sweep of this account that died holding its lease (never ended).
    assert leases.take(harness.ctx, sweep_account.lease_name(harness.org, "memory"), sweep_account.LEASE_S)
    out = sweep(harness)
    assert out["skipped"] and not out["findings"] and ghost.state == "running"
    assert [f["action"] for f in sweep(harness, dry_run=True)["findings"]] == ["would release"]  # no lease needed
    harness.clock.advance(sweep_account.LEASE_S + 1)
    [f] = sweep(harness)["findings"]
    assert f["action"] == "release" and ghost.state == "terminated"
    assert "skipped" not in sweep(harness)  # each sweep ends its lease


def test_an_account_sweep_reads_its_connection_once(harness: Harness, cloud: ChaosCloud, monkeypatch) -> None:
    from shared.store import get_store

    ghost = cloud.add_foreign(RunRef(get_settings().deployment_id, harness.org, "r-ghost").tags, now())
    harness.clock.advance(grace() + 1)
    connections = get_store().connections
    reads: list[tuple[str, str]] = []
    real_get = connections.get

    def counted(org: str, slot: str) -> Any:
        reads.append((org, slot))
        return real_get(org, slot)

    monkeypatch.setattr(connections, "get", counted)
    out = sweep_account.sweep_one(harness.ctx, harness.org, "memory", sweep_id="s20260101000000-cccccc", dry_run=False)
    assert [f["action"] for f in out["findings"]] == ["release"] and ghost.state == "terminated"
    assert reads == [(harness.org, "compute:memory")], reads


def test_a_second_delivery_of_one_sweep_does_nothing(harness: Harness, cloud: ChaosCloud) -> None:
    ghost = cloud.add_foreign(RunRef(get_settings().deployment_id, harness.org, "r-ghost").tags, now())
    harness.clock.advance(grace() + 1)
    first = sweep_account.sweep_one(harness.ctx, harness.org, "memory", sweep_id="s20260101000000-aaaaaa", dry_run=False)
    assert [f["action"] for f in first["findings"]] == ["release"] and ghost.state == "terminated"
    listed = cloud.calls.count("list")
    again = sweep_account.sweep_one(harness.ctx, harness.org, "memory", sweep_id="s20260101000000-aaaaaa", dry_run=False)
    assert "already" in again["skipped"] and cloud.calls.count("list") == listed  # not even listed again


def test_a_long_account_sweep_renews_its_short_lease(harness: Harness, cloud: ChaosCloud) -> None:
    ghost = cloud.add_foreign(RunRef(get_settings().deployment_id, harness.org, "r-ghost").tags, now())
    harness.clock.advance(grace() + 1)
    name = sweep_account.lease_name(harness.org, "memory")
    taken_meanwhile: list[object] = []

    class Slow:
        """A cloud whose listing takes 70 s and whose release takes 40 s (simulated)."""

        def __init__(self, provider: ComputeProvider) -> None:
            self.provider = provider

        def __getattr__(self, attr: str) -> Any:
            return getattr(self.provider, attr)

        def list_managed(self) -> Any:
            listed = list(self.provider.list_managed())
            harness.clock.advance(70)
            return listed

        def release(self, *args: Any) -> Any:
            harness.clock.advance(40)  # 110 s into the sweep: past a lease of 90 s that was never renewed
            taken_meanwhile.append(leases.take(harness.ctx, name, 60))
            return self.provider.release(*args)

    out = sweep_account.sweep_one(harness.ctx, harness.org, "memory", sweep_id="s20260101000000-bbbbbb", dry_run=False,
                                  compute=lambda rec: cast(ComputeProvider, Slow(compute_of(harness.ctx, rec))))
    assert [f["action"] for f in out["findings"]] == ["release"] and ghost.state == "terminated"
    assert taken_meanwhile == [None]  # renewed before the release: nobody could take it meanwhile
    assert leases.take(harness.ctx, name, 60) is not None  # ended when the sweep was done


def test_a_second_control_plane_on_the_same_deployment_id_stops_the_sweep_loudly(harness: Harness,
                                                                                   cloud: ChaosCloud) -> None:
    from shared.providers.base import TAG_STORE

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.3)
    [mine] = cloud.machines.values()
    assert mine.tags[TAG_STORE]  # every machine carries its state store's mark
    # A staging copy left on the production deployment id launched into the same account: its run is
    # "missing" here. Without the mark it is a leak to release.
    theirs = cloud.add_foreign({**RunRef(get_settings().deployment_id, harness.org, "r-theirs").tags,
                                TAG_STORE: "0123456789ab"}, now())
    harness.clock.advance(grace() + 1)
    harness.agent(run_id).heartbeat("training", 0.4)
    [f] = sweep(harness)["findings"]
    assert f["action"] == "none" and "another control plane" in f["reason"] and "TENSORANT_DEPLOYMENT_ID" in f["reason"]
    assert theirs.state == "running" and mine.state == "running"
    assert audits("sweep-refused-duplicate-deployment")
