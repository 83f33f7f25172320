"""Agent logs are bounded and paginated, so an agent cannot fill the tables: line length, bytes per heartbeat,
chunks under the table's property limit, lines per run, the logs cursor, and the agent
dropping a batch the control plane refused instead of resending it forever."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from machine.agent.agent import Agent
from machine.agent.config import AgentConfig
from machine.agent.heartbeat import MAX_LINES_PER_HEARTBEAT
from shared.services.api import agent as agent_service
from shared.store import get_store
from shared.store.logs import LOG_CHUNK_CHARS, log_chunks
from tests.fakes import Cloud, training_run
from tests.harness import Harness, TestAgent, smoke_adapter_zip


def beat(harness: Harness, agent: TestAgent, logs: list[str]) -> tuple[int, Any]:
    status, body, _ = harness.call("POST", f"/api/agent/runs/{agent.run_id}/heartbeat", token=agent.token,
                             json_body={"phase": "training", "progress": 0.5, "logs": logs})
    return status, body


def test_long_lines_are_cut_and_marked(harness: Harness, cloud: Cloud) -> None:
    run_id, agent = training_run(harness)
    agent.heartbeat("training", 0.2, ["short", "y" * 50_000])
    lines = harness.ok("GET", f"/api/runs/{run_id}/logs")["lines"]
    assert lines[0] == "short"
    assert lines[1] == "y" * agent_service.MAX_LINE_CHARS + agent_service.TRUNCATED_MARK


def test_a_heartbeat_over_the_byte_limit_is_refused_before_any_write(harness: Harness, cloud: Cloud) -> None:
    run_id, agent = training_run(harness)
    before, _ = get_store().runs.get(harness.org, run_id)
    # 500 lines of 2000 characters: 1 MB, the table entity's limit. Before: a 500 after the run was written.
    status, body = beat(harness, agent, ["z" * 2000] * 500)
    assert status == 422, body
    assert "logs" in body["detail"] and "smaller batches" in body["detail"]
    after, _ = get_store().runs.get(harness.org, run_id)
    assert after == before
    assert harness.ok("GET", f"/api/runs/{run_id}/logs")["lines"] == []


def test_chunks_keep_every_property_under_the_table_limit() -> None:
    # Non-ASCII is stored escaped (json.dumps): a character can take 12 (a surrogate pair).
    lines = ["a" * 2000, "é" * 2000, "😀" * 2000, "b"] * 20
    chunks = log_chunks(lines)
    assert [x for c in chunks for x in c] == lines
    assert all(len(json.dumps(c)) <= LOG_CHUNK_CHARS < 32_000 for c in chunks)


def test_a_run_keeps_at_most_its_line_cap_with_one_warning(harness: Harness, cloud: Cloud,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_service, "MAX_RUN_LOG_LINES", 30)
    run_id, agent = training_run(harness)
    agent.heartbeat("training", 0.2, [f"a{i}" for i in range(25)])
    agent.heartbeat("training", 0.3, [f"b{i}" for i in range(10)])
    agent.heartbeat("training", 0.4, [f"c{i}" for i in range(10)])
    lines = harness.ok("GET", f"/api/runs/{run_id}/logs")["lines"]
    assert lines[:30] == [f"a{i}" for i in range(25)] + [f"b{i}" for i in range(5)]
    assert len(lines) == 31 and "further lines are dropped" in lines[30]
    warnings = [e for e in harness.get_run(run_id)["events"] if e["kind"] == "warning" and "log lines" in e["message"]]
    assert len(warnings) == 1
    assert harness.get_run(run_id)["state"] == "training"  # the heartbeats themselves were accepted


def test_logs_are_paginated_with_a_cursor(harness: Harness, cloud: Cloud) -> None:
    run_id, agent = training_run(harness)
    sent = [f"line {i}" for i in range(1200)]
    for i in range(0, len(sent), 400):
        agent.heartbeat("training", 0.5, sent[i:i + 400])
    got: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params = {"limit": "250", **({"after": after} if after else {})}
        page = harness.ok("GET", f"/api/runs/{run_id}/logs", params=params)
        assert page["state"] == "training" and len(page["lines"]) <= 250
        got += page["lines"]
        pages += 1
        if not page["lines"]:
            break
        after = page["next"]
    assert got == sent and pages == 6
    assert after == "1200"  # a running run keeps a cursor: polling it picks up new lines
    agent.heartbeat("training", 0.6, ["later"])
    assert harness.ok("GET", f"/api/runs/{run_id}/logs", params={"after": after})["lines"] == ["later"]
    default = harness.ok("GET", f"/api/runs/{run_id}/logs")
    assert len(default["lines"]) == 1000 and default["next"] == "1000"


def test_the_cursor_ends_when_the_run_is_terminal(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).train(smoke_adapter_zip())
    page = harness.ok("GET", f"/api/runs/{run_id}/logs")
    assert page["state"] == "succeeded" and page["next"] is None and "training 0.5" in page["lines"]


@pytest.mark.parametrize("params", [{"after": "x"}, {"after": "-1"}, {"after": "1" * 11}, {"limit": "0"},
                                    {"limit": "5001"}, {"limit": "ten"}])
def test_bad_cursor_or_limit_is_422(harness: Harness, cloud: Cloud, params: dict[str, str]) -> None:
    run_id, _ = training_run(harness)
    status, body, _ = harness.call("GET", f"/api/runs/{run_id}/logs", params=params)
    assert status == 422 and body["errors"][0]["field"] in params


# ---------------------------------------------------------------- the agent's side


class RefusingApi:
    """A loopback control plane that refuses heartbeats carrying logs with `status`."""

    def __init__(self, status: int) -> None:
        self.bodies: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.bodies.append(body)
                code = status if body.get("logs") else 200
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def refusing() -> Iterator[RefusingApi]:
    api = RefusingApi(422)
    yield api
    api.server.shutdown()


def make_agent(url: str, tmp_path: Path) -> Agent:
    config = AgentConfig(run_id="r-1", api_url=url, token="t" * 40, base_model="m", data_dir=tmp_path,
                         trainer_command="true", heartbeat_retry_s=0.5)
    return Agent(config, environ={})


def test_the_agent_drops_a_batch_the_control_plane_refused(refusing: RefusingApi, tmp_path: Path) -> None:
    agent = make_agent(refusing.url, tmp_path)
    try:
        agent._record("the line the server refuses")
        agent.heartbeat("training")
        agent.heartbeat("training")
        agent.heartbeat("training")
        carried = [b for b in refusing.bodies if "the line the server refuses" in b["logs"]]
        assert len(carried) == 1, refusing.bodies  # before: resent with every heartbeat, forever
        assert "the line the server refuses" in (tmp_path / "logs.txt").read_text()  # kept for the upload
    finally:
        agent.logs_file.close()


def test_the_agent_batches_by_bytes_as_well_as_lines(tmp_path: Path) -> None:
    api = RefusingApi(200)
    agent = make_agent(api.url, tmp_path)
    try:
        for i in range(300):
            agent._record(f"{i:03d} " + "q" * 2500)  # cut to 2000 characters by the agent
        agent.heartbeat("training")
        sizes = [sum(len(x.encode()) for x in b["logs"]) for b in api.bodies]
        assert sum(len(b["logs"]) for b in api.bodies) == 300
        assert max(sizes) < agent_service.MAX_HEARTBEAT_LOG_BYTES and len(api.bodies) >= 3
        assert all(len(b["logs"]) <= MAX_LINES_PER_HEARTBEAT for b in api.bodies)
    finally:
        agent.logs_file.close()
        api.server.shutdown()
