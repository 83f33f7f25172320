"""Poison messages through the admin HTTP handlers: list with run and last error, replay, discard."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.queues import Queue, get_queues
from tests.chaos.fixtures import audits
from tests.chaos.provider import ChaosCloud, ChaosCompute
from tests.fakes import Cloud, serve_memory
from tests.harness import Harness

POISON = "/api/platform/queues/release/poison"


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """`cloud`, and so `harness`, on the chaos provider: its faults on demand (tests/chaos/provider.py)."""
    yield from serve_memory(ChaosCloud(), ChaosCompute)


def poisoned_release(harness: Harness, cloud: ChaosCloud) -> str:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    cloud.always["release"] = RuntimeError("socket closed by the cloud API")
    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": True})
    harness.drain()
    return run_id


def test_failing_message_lands_in_poison_and_replay_succeeds_once_fixed(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = poisoned_release(harness, cloud)
    assert get_queues().length(Queue.release.value) == 0
    depths = {q["name"]: q for q in harness.ok("GET", "/api/platform/queues", token="admin")["items"]}
    assert depths["release"]["poison_length"] == 1
    [item] = harness.ok("GET", POISON, token="admin")["items"]
    assert item["run_id"] == run_id and item["run_state"] == "releasing" and "dequeue_count" in item
    assert "RuntimeError: socket closed by the cloud API" in item["last_error"]
    # Replayed while the fault is still there: back in poison after maxDequeueCount.
    assert harness.ok("POST", f"{POISON}/replay", token="admin", json_body={})["replayed"] == [item["id"]]
    harness.drain()
    assert harness.get_run(run_id)["state"] == "releasing"
    [again] = harness.ok("GET", POISON, token="admin")["items"]
    del cloud.always["release"]
    harness.ok("POST", f"{POISON}/replay", token="admin", json_body={"message_id": again["id"]})
    harness.drain()
    assert harness.get_run(run_id)["state"] == "cancelled" and not cloud.live()
    assert not harness.ok("GET", POISON, token="admin")["items"]
    assert [a["run_id"] for a in audits("poison-replay")] == [run_id, run_id]


def test_replay_one_leaves_the_others(harness: Harness, cloud: ChaosCloud) -> None:
    first = poisoned_release(harness, cloud)
    second = poisoned_release(harness, cloud)
    items = {i["run_id"]: i["id"] for i in harness.ok("GET", POISON, token="admin")["items"]}
    assert set(items) == {first, second}
    del cloud.always["release"]
    harness.ok("POST", f"{POISON}/replay", token="admin", json_body={"message_id": items[second]})
    harness.drain()
    assert harness.get_run(second)["state"] == "cancelled" and harness.get_run(first)["state"] == "releasing"
    assert [i["run_id"] for i in harness.ok("GET", POISON, token="admin")["items"]] == [first]


def test_discard_is_audited_and_unknown_ids_are_404(harness: Harness, cloud: ChaosCloud) -> None:
    run_id = poisoned_release(harness, cloud)
    [item] = harness.ok("GET", POISON, token="admin")["items"]
    status, body, _ = harness.call("DELETE", f"{POISON}/no-such-id", token="admin")
    assert status == 404
    assert harness.ok("DELETE", f"{POISON}/{item['id']}", token="admin")["discarded"] == [item["id"]]
    assert not harness.ok("GET", POISON, token="admin")["items"]
    [a] = audits("poison-discard")
    assert a["run_id"] == run_id and a["by"] == "admin@platform" and a["body"]["run_id"] == run_id


def test_admin_only_and_known_queues_only(harness: Harness, cloud: ChaosCloud) -> None:
    assert harness.call("GET", POISON, token="owner")[0] == 403
    assert harness.call("POST", f"{POISON}/replay", token="member", json_body={})[0] == 403
    assert harness.call("POST", "/api/platform/sweep", token="owner", json_body={"dry_run": True})[0] == 403
    status, body, _ = harness.call("GET", "/api/platform/queues/nope/poison", token="admin")
    assert status == 422 and "unknown queue" in str(body)
