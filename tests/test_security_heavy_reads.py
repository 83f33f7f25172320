"""Heavy reads and uploads are rate-limited per org, and /metrics reads a bounded page of the log
(quotas.take_read, logs.METRIC_LINES). Before: every /metrics call read and parsed the whole log (40 MB),
and dataset uploads had no rate limit; another org's median latency went from 38 ms to 392 and 168 ms."""

from __future__ import annotations

from typing import Any

from shared.services.api import quotas
from shared.services.api.runs.logs import METRIC_LINES
from tests.fakes import Cloud
from tests.harness import Harness


def _lines(first_step: int, count: int) -> list[str]:
    return [f"progress=0.5 step={first_step + i} loss={1 + i / 10_000:.4f}" for i in range(count)]


def test_metrics_read_the_newest_page_and_follow_a_cursor(harness: Harness, cloud: Cloud) -> None:
    from shared.store import get_store

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    total = METRIC_LINES * 2 + 500
    for start in range(0, total, 500):
        agent.heartbeat("training", 0.5, _lines(start, min(500, total - start)))
    reads: list[int] = []
    store = get_store()
    original = store.logs.read

    def counting(run: str, after: int, limit: int) -> tuple[list[str], int]:
        reads.append(limit)
        return original(run, after, limit)

    store.logs.read = counting  # type: ignore[method-assign,assignment]
    try:
        newest = harness.ok("GET", f"/api/runs/{run_id}/metrics")
        assert reads == [METRIC_LINES]  # not the whole log
        assert newest["from_line"] == total - METRIC_LINES and newest["truncated"] is True
        assert [p["step"] for p in newest["points"]][-1] == total - 1
        steps: list[int] = []
        cursor: Any = "0"
        while cursor is not None:
            page = harness.ok("GET", f"/api/runs/{run_id}/metrics", params={"after": cursor})
            steps += [p["step"] for p in page["points"]]
            cursor = None if page["next"] == cursor else page["next"]  # a running run's end: no new lines
        assert steps == list(range(total))
        assert max(reads) == METRIC_LINES
    finally:
        store.logs.read = original  # type: ignore[method-assign]
    status, body, _ = harness.call("GET", f"/api/runs/{run_id}/metrics", params={"after": "-1"})
    assert status == 422 and body["errors"][0]["field"] == "after", body


def test_metrics_reads_and_dataset_uploads_are_rate_limited_per_org(harness: Harness, cloud: Cloud) -> None:
    project = harness.project_and_dataset()
    run_id = harness.create_run("memory", "mem-a10", project=project)
    harness.ok("PUT", "/api/org/limits", json_body={"runs_per_minute": 1})
    harness.clock.t = (int(harness.clock.t // 60) + 1) * 60 + 1.0  # a new minute: the dataset upload above is not counted
    codes = [harness.call("GET", f"/api/runs/{run_id}/metrics")[0] for _ in range(quotas.HEAVY_READS_PER_RUN + 1)]
    assert codes == [200] * quotas.HEAVY_READS_PER_RUN + [429], codes
    data = b'{"prompt": "a", "completion": "b"}\n' * 3
    path = f"/api/projects/{project[0]}/datasets"
    first, second = (harness.call("POST", path, body=data, content_type="application/x-ndjson") for _ in range(2))
    assert first[0] == 201 and second[0] == 429, (first[:2], second[:2])
    assert "uploads (datasets, their commits, recovery archives) in a minute" in second[1]["detail"]
    harness.clock.advance(60)
    assert harness.call("GET", f"/api/runs/{run_id}/metrics")[0] == 200  # the next minute


def test_recovery_uploads_count_with_the_dataset_uploads(harness: Harness, cloud: Cloud) -> None:
    """Before: a member's recovery uploads (each verified: up to 2.3 s of CPU) were not counted with the
    other heavy uploads, and one to a run being recovered was read and answered with no count at all."""
    from tests.harness import smoke_adapter_zip

    project = harness.project_and_dataset()
    run_id = harness.create_run("memory", "mem-a10", project=project)
    harness.ok("PUT", "/api/org/limits", json_body={"runs_per_minute": 1})
    harness.clock.t = (int(harness.clock.t // 60) + 1) * 60 + 1.0  # a new minute
    data = b'{"prompt": "a", "completion": "b"}\n' * 3
    assert harness.call("POST", f"/api/projects/{project[0]}/datasets", body=data,
                  content_type="application/x-ndjson")[0] == 201
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/recover", token="member", body=smoke_adapter_zip(),
                             content_type="application/zip")
    assert status == 429 and "recovery archives" in body["detail"], (status, body)
