"""`recover --resume` outside the local provider: refused before any cloud call.

The local provider's resume is driven end to end in tests/e2e/test_checkpoints_e2e.py."""

from __future__ import annotations

from typing import Any

from tests.fakes import Cloud, MemoryCompute
from tests.harness import Harness


def test_resume_on_a_cloud_is_refused_and_starts_nothing(h: Harness, cloud: Cloud, monkeypatch: Any) -> None:
    run_id = h.create_run("memory", "mem-a10")
    h.launch(run_id)
    h.agent(run_id).complete_failed("boom")
    assert h.get_run(run_id)["state"] == "retained"
    started: list[Any] = []
    monkeypatch.setattr(MemoryCompute, "start", lambda self, ref, resources: started.append(ref))
    status, body, _ = h.call("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    assert status == 409, body
    assert "only on the local provider" in body["detail"] and "verify_saved" in body["detail"]
    assert h.get_run(run_id)["state"] == "retained" and started == []
