"""Chaos with two hosts (issue 12.11): two Functions host processes on one Azurite and one
shared cloud, both running every step and both timers, dying for real (os._exit) at random
store writes and provider calls and restarted, with provider faults and duplicate deliveries
(copies sent to the other host, messages delivered again after success). Afterwards the
invariants of the one-host chaos test hold. CHAOS_SEED and CHAOS_TWO_HOST_RUNS vary it."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared import clock
from shared.settings import get_settings, reset_settings
from shared.store import get_store
from tests.chaos.driver import assert_at_rest
from tests.chaos.file_cloud import FileCloud
from tests.chaos.host import HostConfig, SpeedClock
from tests.chaos.provider import install_chaos_provider, uninstall_chaos_provider
from tests.chaos.two_hosts import TwoHosts
from tests.harness import Harness

SEED = int(os.environ.get("CHAOS_SEED", "20261201"))
RUNS = int(os.environ.get("CHAOS_TWO_HOST_RUNS", "60"))
SPEED = 100.0  # simulated seconds per wall second
CHAOS_S = 10.0  # wall seconds of faults after the last run was launched


@pytest.fixture
def two_hosts(env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoHosts]:
    # Deadlines short enough to pass within the test at SPEED (both hosts inherit them).
    monkeypatch.setenv("TENSORANT_PROVISIONING_TIMEOUT_S", "1200")
    monkeypatch.setenv("TENSORANT_HEARTBEAT_TIMEOUT_S", "600")
    reset_settings()
    cloud = FileCloud(tmp_path / "cloud.json")
    with cloud.lock:
        cloud.invisible_s = 50.0  # a new machine is missing from listings for 50 simulated seconds
    install_chaos_provider(cloud)  # this process's provider (no faults): saving the connection
    h = Harness()
    try:
        h.save_storage({"kind": "local"})
        assert h.save_compute("memory", {})["status"] == "connected"
        project = h.project_and_dataset()
    finally:
        h.close()
    start = time.time()
    clock.set_clock(SpeedClock(start, start, SPEED))
    config = HostConfig(name="", workdir=str(tmp_path), clock=(start, start, SPEED), seed=SEED, crash_rate=0.015,
                        provider_crash_rate=0.03, fault_rate=0.15, duplicate_rate=0.1, visibility_s=3,
                        heartbeat_check_every_s=0.5, sweep_every_s=2.0)
    chaos = TwoHosts(tmp_path, cloud, project, h.org, runs=RUNS, seed=SEED, config=config)
    try:
        yield chaos
    finally:
        chaos.stop()
        clock.set_clock(None)
        uninstall_chaos_provider()


def test_two_hosts_leave_nothing_leaked_stuck_or_duplicated(two_hosts: TwoHosts) -> None:
    chaos = two_hosts
    started = time.perf_counter()
    chaos.start()
    chaos.create_runs()
    created_s = time.perf_counter() - started
    time.sleep(CHAOS_S)
    chaos.calm()
    grace = get_settings().sweep_grace_s
    settle_s = chaos.settle(quiet_sim_s=grace + 2 * chaos.config.sweep_every_s * SPEED, max_wall_s=90)
    chaos.stop()

    store = get_store()
    runs = {r.id: r for r in store.list_runs(chaos.org)}
    states = Counter(r.state.value for r in runs.values())
    audit = Counter(a["action"] for a in store.list_audit())
    events = chaos.events()
    kinds = Counter(e["event"] for e in events)
    crashes = [e for e in events if e["event"] == "crash"]
    deliveries = [e for e in events if e["event"] == "delivery"]
    by_host = Counter(e["host"] for e in deliveries)
    hosts_of: dict[str, set[str]] = {}
    for e in deliveries:
        hosts_of.setdefault(e["key"], set()).add(e["host"])
    shared = sum(1 for hosts in hosts_of.values() if len(hosts) > 1)
    timers = Counter((e["host"], e["name"]) for e in events if e["event"] == "timer")
    with chaos.cloud.lock:
        created = dict(chaos.cloud.created)
    print(f"\ntwo-host chaos seed={SEED} runs={len(runs)} scripts={dict(chaos.scripts)}")
    print(f"final states: {dict(states)}")
    print("reasons:", dict(Counter((chaos.agents.by_run[r.id].script, r.state.value, (r.reason or "")[:70])
                                   for r in runs.values())))
    print(f"host starts {dict(chaos.sup.starts)}, crashes {sum(chaos.sup.crashes.values())} "
          f"(by op: {dict(Counter(e['when'] + ' ' + e['op'] for e in crashes))}; "
          f"by step: {dict(Counter(e['step'] for e in crashes))})")
    print(f"deliveries {len(deliveries)} (by host {dict(by_host)}, failed {sum(not e['ok'] for e in deliveries)}), "
          f"messages run by both hosts {shared}, duplicate sends {kinds['duplicate-send']}, "
          f"redeliveries {kinds['redeliver']}, leases lost {kinds['lease-lost']}, poisoned {kinds['poison']}, "
          f"replayed {chaos.replayed}; provider faults {kinds['fault']}; timer ticks {dict(timers)}")
    print(f"sweeper: leaks released {audit['sweep-release']}, vanished machines retained {audit['sweep-retain']}, "
          f"releases re-sent {audit['sweep-release-retry']}")
    print(f"machines created {sum(created.values())}, max per run {max(created.values(), default=0)}; "
          f"wall: create {created_s:.1f}s, settle {settle_s:.1f}s, total {time.perf_counter() - started:.1f}s")

    assert not chaos.sup.failures, "a host died of something other than an injected crash:\n" + \
        "\n".join(chaos.sup.failures)
    assert len(runs) == RUNS
    assert chaos.pending() == 0, "messages left in the queues or poison queues"
    assert_at_rest(runs, chaos.cloud)
    # The chaos really happened: both hosts worked and died, at store writes and provider calls,
    # before and after; messages were run by both hosts; both hosts ran both timers.
    assert all(by_host[name] > 0 and chaos.sup.crashes[name] > 0 for name in chaos.names), (by_host, chaos.sup)
    assert {e["when"] for e in crashes} == {"before", "after"}
    assert {e["op"].split(".")[0] for e in crashes} == {"store", "provider"}
    assert shared >= 5 and kinds["duplicate-send"] >= 5 and kinds["fault"] >= 5
    assert all(timers[(name, t)] > 0 for name in chaos.names for t in ("heartbeat_check", "sweeper"))
    assert states["succeeded"] > 0 and states["retained"] > 0
