"""What ended runs leave in the tables is bounded (issue 38.6): the prune-history timer deletes the events and
log lines of runs ended more than their organization's retention ago; the run record and its ledger are kept
(shared/services/timers/prune_history.py, store.ended)."""

from __future__ import annotations

import json
from typing import Any

from shared.services.timers import prune_history
from shared.store import get_store
from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip

DAY = 24 * 3600
HISTORY = ("events", "logs")


def _ended_run(harness: Harness) -> str:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    for i in range(5):
        agent.heartbeat("training", 0.1 * i, logs=[f"step {i} loss {1.0 / (i + 1):.3f}"] * 20)
    agent.train(smoke_adapter_zip())
    harness.drain()
    assert harness.get_run(run_id)["state"] == "succeeded"
    return run_id


def _bytes(table: str, run_id: str) -> int:
    """What the run holds in one table: its partitions' entities, as stored (JSON data)."""
    t = get_store().table(table)
    parts = [run_id, f"{run_id}~newest"] if table == "events" else [run_id]
    return sum(len(json.dumps(d)) for p in parts for d, _ in t.query("PartitionKey eq @p", p=p))


def _sizes(run_id: str) -> dict[str, int]:
    return {t: _bytes(t, run_id) for t in (*HISTORY, "ledger", "runs")} | {
        "runs": len(json.dumps(get_store().runs.get(*_key(run_id))[0].model_dump(mode="json")))}


def _key(run_id: str) -> tuple[str, str]:
    [run] = [r for r in get_store().runs.all_orgs() if r.id == run_id]
    return run.org, run.id


def test_an_ended_runs_events_and_logs_are_pruned_after_the_retention(harness: Harness, cloud: Cloud,
                                                                      capsys: Any) -> None:
    run_id = _ended_run(harness)
    before = _sizes(run_id)
    assert before["events"] > 0 and before["logs"] > 0 and before["ledger"] > 0
    ledger = get_store().ledger.read(run_id)
    harness.clock.advance(2 * DAY)
    harness.tick("prune_history")
    assert _sizes(run_id) == before  # within the org's 14 days: kept (and looked at again only at 14 days)
    harness.clock.advance(12 * DAY - 600)
    assert prune_history.prune_all(harness.ctx)["due"] == 0  # not read again before it is due
    harness.clock.advance(3600)
    counts = prune_history.prune_all(harness.ctx)
    assert counts["pruned"] == 1 and counts["rows_deleted"] > 0, counts
    after = _sizes(run_id)
    assert after["logs"] == 0
    assert get_store().ledger.read(run_id) == ledger  # the ledger and the record are kept
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded" and run["final_cost"] is not None
    # One note says so; the view still shows the run's last change, from its record (events.pending_transition).
    [note] = [e["message"] for e in run["events"] if e["kind"] == "audit"]
    assert "pruned" in note and "14 days" in note
    assert [e["message"].split(":")[0] for e in run["events"] if e["kind"] == "transition"] == ["releasing -> succeeded"]
    assert prune_history.prune_all(harness.ctx)["due"] == 0  # done once
    with capsys.disabled():
        grew = sum(before[t] for t in HISTORY)
        kept = sum(after[t] for t in HISTORY)
        print(f"\n  a run's table bytes: events+logs {grew} -> {kept} after the prune; run record {before['runs']}, "
              f"ledger {before['ledger']} kept")


def test_an_orgs_longer_retention_keeps_the_history_longer(harness: Harness, cloud: Cloud) -> None:
    harness.ok("PUT", "/api/org/limits", json_body={"retention_limit_s": 30 * DAY})
    run_id = _ended_run(harness)
    before = _sizes(run_id)
    harness.clock.advance(15 * DAY)
    assert prune_history.prune_all(harness.ctx)["later"] == 1
    assert _sizes(run_id) == before
    harness.clock.advance(16 * DAY)
    assert prune_history.prune_all(harness.ctx)["pruned"] == 1
    assert _sizes(run_id)["logs"] == 0
