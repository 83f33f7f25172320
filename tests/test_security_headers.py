"""Every JSON answer (problems and the adapter's download URL included) says no-store and nosniff
(issue 41.5): a browser or proxy must not keep an org's data or a presigned URL, nor sniff JSON into HTML."""

from __future__ import annotations

from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip


def _no_store(headers: dict[str, str]) -> None:
    lowered = {k.lower(): v for k, v in headers.items()}
    assert lowered.get("cache-control") == "no-store", headers
    assert lowered.get("x-content-type-options") == "nosniff", headers


def test_json_answers_are_not_stored_or_sniffed(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).train(smoke_adapter_zip())
    assert harness.get_run(run_id)["state"] == "succeeded"
    for method, path, token in (("GET", "/api/runs", "member"), ("GET", f"/api/runs/{run_id}", "member"),
                                ("GET", f"/api/runs/{run_id}/adapter", "member"), ("GET", "/api/runs", None),
                                ("GET", "/api/runs/r-nope", "member")):
        status, _, headers = harness.call(method, path, token=token)
        assert status in (200, 401, 404), (path, status)
        _no_store(headers)
