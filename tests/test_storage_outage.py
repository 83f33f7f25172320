"""The state store unreachable (Azurite stopped under a run): the API answers 503 with Retry-After,
quickly, and the run goes on once the store is back (no run is failed for an outage it could wait out)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from shared import queues, settings
from shared.store import reset_store
from tests.azurite import Azurite
from tests.fakes import Cloud, install_memory_provider, uninstall_memory_provider
from tests.harness import Harness, smoke_adapter_zip


@pytest.fixture
def own_azurite(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Azurite]:
    az = Azurite(persist=True).start()
    monkeypatch.setenv("AzureWebJobsStorage", az.connection_string)
    settings.reset_settings()
    reset_store()
    queues.reset_queues()
    yield az
    az.stop()
    reset_store()
    queues.reset_queues()


def test_an_outage_answers_503_quickly_and_the_run_goes_on_after(own_azurite: Azurite) -> None:
    install_memory_provider(Cloud())
    h = Harness()
    try:
        h.save_storage({"kind": "local"})
        h.save_compute("memory", {})
        run_id = h.create_run("memory", "mem-a10")
        h.launch(run_id)
        agent = h.agent(run_id)
        agent.heartbeat("training", 0.2)

        own_azurite.stop(keep_data=True)
        for method, path, token, body in (
                ("GET", f"/api/runs/{run_id}", "member", None),
                ("POST", "/api/runs", "member", {}),
                ("POST", f"/api/agent/runs/{run_id}/heartbeat", agent.token, {"phase": "training", "progress": 0.4})):
            started = time.monotonic()
            status, out, headers = h.call(method, path, token=token, json_body=body)
            took = time.monotonic() - started
            if path == "/api/runs" and status == 422:
                continue  # an empty body is refused before the store is asked: nothing to wait for
            assert status == 503, (path, status, out)
            assert "state store" in out["detail"] and headers["Retry-After"] == "5"
            assert took < 4, (path, took)  # not the SDK's ~5 s of default retries
            print(f"\n{method} {path.split('/')[2]}: 503 in {took:.2f} s")

        own_azurite.start()
        assert agent.heartbeat("training", 0.6)["stop"] is False
        agent.train(smoke_adapter_zip())
        run = h.get_run(run_id)
        assert run["state"] == "succeeded", (run["reason"], h.step_errors)
    finally:
        h.close()
        uninstall_memory_provider()
