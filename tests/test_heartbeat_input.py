"""What a heartbeat may carry: typed strictly, and text that cannot be stored is made storable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import Harness


@pytest.fixture
def run_id(harness: Harness, cloud: Any) -> Iterator[str]:
    rid = harness.create_run("memory", "mem-a10")
    harness.launch(rid)
    yield rid


def _beat(harness: Harness, run_id: str, body: bytes) -> tuple[int, Any]:
    token = harness.agent(run_id).token
    status, out, _ = harness.call("POST", f"/api/agent/runs/{run_id}/heartbeat", token=token, body=body)
    return status, out


def test_a_lone_surrogate_in_a_log_line_is_replaced_not_a_500(harness: Harness, run_id: str) -> None:
    body = b'{"phase": "training", "progress": 0.5, "logs": ["loss \\ud800 x", "emoji \\ud83d\\ude00", "\\uDFFF"]}'
    status, out = _beat(harness, run_id, body)
    assert status == 200, out
    lines = harness.ok("GET", f"/api/runs/{run_id}/logs")["lines"]
    assert lines[-3:] == ["loss \ufffd x", "emoji \U0001F600", "\ufffd"]  # an escaped pair is a real character


@pytest.mark.parametrize("progress", ['"0.5"', "true", "null", "1.5", "-0.1"])
def test_progress_must_be_a_number_from_0_to_1(harness: Harness, run_id: str, progress: str) -> None:
    status, out = _beat(harness, run_id, f'{{"phase": "training", "progress": {progress}}}'.encode())
    assert status == 422, out
    assert any(e["field"] == "progress" for e in out["errors"]), out


def test_log_lines_must_be_strings(harness: Harness, run_id: str) -> None:
    status, out = _beat(harness, run_id, b'{"phase": "training", "logs": [1, true]}')
    assert status == 422 and out["errors"][0]["field"].startswith("logs"), out
