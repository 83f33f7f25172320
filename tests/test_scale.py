"""Thousands of organizations: what the timers read grows with what is active, never with what ever
existed (the watch index), and the sweeper's fan-out reaches every connection, rotating.

The store is the real one on Azurite; its tables are wrapped to count the calls (tests/table_calls.py's
Calls). The scale itself, 10 to 10,000 orgs, is measured by `make bench-scale` (tests/bench/scale_bench.py).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest

from shared.context import Context
from shared.models import RunRecord, RunState
from shared.queues import get_queues
from shared.services.timers import heartbeat_check, sweeper
from shared.steps import Step
from shared.store import get_store
from tests.fakes import Cloud, training_run
from tests.harness import Harness, smoke_adapter_zip
from tests.table_calls import Calls


def finished_copies(run: RunRecord, n: int) -> None:
    """n ended runs of the same org written straight to the table: the history a busy org keeps."""
    store = get_store()
    for i in range(n):
        store.runs.create(run.model_copy(update={"id": f"{run.id}-old{i:03d}", "state": RunState.succeeded}))


def test_heartbeat_check_reads_the_active_runs_not_the_history(harness: Harness, cloud: Cloud, calls: Calls) -> None:
    run_id, _ = training_run(harness)
    run, _ = get_store().runs.get(harness.org, run_id)
    finished_copies(run, 40)
    heartbeat_check.check_all(harness.ctx)  # builds the index once (one scan), for records older than it
    calls.take()
    counts = heartbeat_check.check_all(harness.ctx)
    got = calls.take()
    assert counts["watched"] == 1
    # One point read of the one active run; no query of the runs table at all.
    assert got[("runs", "get")] == 1 and got[("runs", "query")] == 0 and got[("runs", "pages")] == 0, got


def test_the_index_follows_the_state_changes(harness: Harness, cloud: Cloud) -> None:
    store = get_store()
    run_id = harness.create_run("memory", "mem-a10")
    assert (harness.org, run_id) not in store.watch.ids(harness.org)  # a draft waits on nothing
    harness.launch(run_id)
    assert (harness.org, run_id) in store.watch.ids(harness.org)
    harness.agent(run_id).train(smoke_adapter_zip())
    assert harness.get_run(run_id)["state"] == "succeeded"
    assert (harness.org, run_id) not in store.watch.ids(harness.org) and (harness.org, run_id) not in store.watch.ids()


def test_the_index_is_built_once_for_runs_recorded_before_it(harness: Harness, cloud: Cloud) -> None:
    store = get_store()
    run_id, _ = training_run(harness)
    store.watch.remove(harness.org, run_id)  # as if written before the index existed
    store.table("watch").delete("~", "built")
    assert heartbeat_check.check_all(harness.ctx)["watched"] == 1
    assert (harness.org, run_id) in store.watch.ids(harness.org)
    assert store.runs.build_watch_index() is None  # done: never scans the runs table again


def test_a_stale_index_row_is_pruned_once_its_run_is_quiet(harness: Harness, cloud: Cloud) -> None:
    store = get_store()
    run_id = harness.create_run("memory", "mem-a10")
    store.watch.add(harness.org, run_id)  # a launch that died between indexing the run and moving it
    heartbeat_check.check_all(harness.ctx)
    assert (harness.org, run_id) in store.watch.ids(harness.org)  # maybe a write in flight: kept
    harness.clock.advance(heartbeat_check.PRUNE_AFTER_S + 1)
    assert heartbeat_check.check_all(harness.ctx)["pruned"] == 1
    assert (harness.org, run_id) not in store.watch.ids(harness.org)


@pytest.fixture
def five_orgs(harness: Harness, cloud: Cloud) -> Iterator[list[tuple[str, str]]]:
    """The harness org's memory connection, copied to four more orgs."""
    store = get_store()
    conn, _ = store.connections.get(harness.org, "compute:memory") or (None, None)
    assert conn is not None
    for i in range(4):
        store.connections.put(conn.model_copy(update={"org": f"zz-org-{i}"}), None)
    yield sweeper.accounts(harness.ctx)


def sent_accounts() -> list[tuple[str, str]]:
    client = get_queues().client(Step.sweep_account.value)
    out = []
    for m in client.receive_messages(messages_per_page=32, visibility_timeout=60):
        body = json.loads(base64.b64decode(m.content))
        out.append((body["org"], body["provider"]))
        out += [(t["org"], t["provider"]) for t in body.get("batch", [])]  # the accounts batched with it
        client.delete_message(m)
    return out


def test_the_fan_out_rotates_so_no_account_starves(five_orgs: list[tuple[str, str]], ctx: Context,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(five_orgs) == 5
    monkeypatch.setattr(sweeper, "FANOUT_MAX_SENDS", 2)  # a fan-out cut short, as by its time budget
    seen: list[tuple[str, str]] = []
    for _ in range(3):
        assert sweeper.tick(ctx)["sent"] == 2
        got = sorted(sent_accounts())  # sent in parallel: in any order within a tick
        assert len(got) == 2
        seen += got
    # Continued where the previous tick stopped, not restarted at the top of the alphabet.
    assert seen == five_orgs[:4] + sorted([five_orgs[4], five_orgs[0]])
    monkeypatch.setattr(sweeper, "FANOUT_MAX_SENDS", 20_000)
    assert sweeper.tick(ctx)["sent"] == 5 and sorted(sent_accounts()) == five_orgs


def test_an_admin_sweep_answers_at_once_and_reports_by_id(harness: Harness, five_orgs: list[tuple[str, str]]) -> None:
    status, body, _ = harness.call("POST", "/api/platform/sweep", token="admin", json_body={"dry_run": True})
    assert status == 202 and body["accounts"] == 5 and body["status_url"].endswith(body["sweep_id"])
    before = harness.ok("GET", body["status_url"], token="admin")
    assert before["done"] == 0 and not before["finished"]  # nothing swept inside the request
    harness.drain()
    after = harness.ok("GET", body["status_url"], token="admin")
    assert after["done"] == 5 and after["finished"]
    status, problem, _ = harness.call("GET", "/api/platform/sweeps/s20990101000000-abcdef", token="admin")
    assert status == 404 and "not found" in problem["detail"]
    status, _, _ = harness.call("GET", body["status_url"], token="owner")
    assert status == 403


def test_the_timers_report_the_fleet_as_metrics(harness: Harness, cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared import metrics
    from shared.providers.base import RunRef
    from shared.settings import get_settings

    seen: list[tuple[str, float, dict[str, object]]] = []
    monkeypatch.setattr(metrics, "gauge", lambda name, value, **a: seen.append((name, value, a)))
    monkeypatch.setattr(metrics, "count", lambda name, amount=1, **a: seen.append((name, amount, a)))
    run_id, _ = training_run(harness)
    heartbeat_check.check_all(harness.ctx)
    run = harness.get_run(run_id)
    assert (metrics.RUNS, 1, {"state": "training"}) in seen
    assert (metrics.MACHINES_BILLING, 1, {"provider": "memory"}) in seen
    assert (metrics.COST_PER_HOUR, round(run["offer"]["total_per_hour"], 4), {"provider": "memory"}) in seen
    seen.clear()
    from shared.clock import now

    cloud.machines["leak"] = type(next(iter(cloud.machines.values())))(
        id="leak", tags=RunRef(get_settings().deployment_id, harness.org, "r-gone").tags, disk_id="vol-leak",
        created_at=now())
    harness.clock.advance(get_settings().sweep_grace_s + 1)
    harness.tick("sweeper")
    harness.drain()
    assert (metrics.SWEEP_FINDINGS, 1, {"kind": "leak"}) in seen and (metrics.SWEEP_FINISHED, 1, {}) in seen
    assert any(name == metrics.POISON_DEPTH and attrs == {"queue": "launch"} for name, _, attrs in seen)
