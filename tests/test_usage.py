"""Time, cost, drafts, resource states and metrics through the real handlers.

The harness clock is simulated, so billed time is exact: the in-memory provider's offer costs
1.01/h while the machine runs (compute 1.00 + disk 0.01) and 0.01/h while only its disk is kept.
"""

from __future__ import annotations

import pytest

from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip


def test_succeeded_run_shows_time_cost_and_released_resources(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    draft = harness.get_run(run_id)
    assert (draft["started_at"], draft["elapsed_s"], draft["cost_so_far"], draft["final_cost"]) == (None, None, 0, None)
    run = harness.launch(run_id)
    assert run["machine_up_at"] and run["released_at"] is None and run["final_cost"] is None
    a = harness.agent(run_id)
    a.heartbeat("training", 0.5, ["progress=0.5 step=1 loss=2.0 lr=0.0002"])
    harness.clock.advance(1800)  # half an hour of training
    live = harness.get_run(run_id)
    assert live["billed_machine_s"] == pytest.approx(1800, abs=1)
    assert live["cost_so_far"] == pytest.approx(1.01 / 2, abs=0.001)
    assert [r["state"] for r in live["resources"]] == ["running", "in use"]
    a.train(smoke_adapter_zip())
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded"
    assert run["phase"] == ""  # not "exporting": the run ended
    assert {r["state"] for r in run["resources"]} == {"released"}
    assert run["released_at"] and run["final_cost"] == pytest.approx(run["cost_so_far"])
    assert run["billed_machine_s"] == pytest.approx(1800, abs=1) and run["billed_disk_only_s"] == 0
    assert run["elapsed_s"] >= run["billed_machine_s"]
    listed = {r["id"]: r for r in harness.ok("GET", "/api/runs")["items"]}[run_id]
    assert listed["final_cost"] == pytest.approx(run["final_cost"]) and listed["phase"] == ""
    harness.clock.advance(3600)  # an ended run costs nothing more
    assert harness.get_run(run_id)["final_cost"] == pytest.approx(run["final_cost"])


def test_retained_time_is_billed_as_disk_only(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.clock.advance(3600)
    harness.agent(run_id).complete_failed("boom", exit_code=3)
    run = harness.get_run(run_id)
    assert run["state"] == "retained"
    assert {r["kind"]: r["state"] for r in run["resources"]} == {"instance": "stopped", "volume": "kept"}
    harness.clock.advance(7200)  # two hours stopped with the disk kept
    run = harness.get_run(run_id)
    assert run["billed_machine_s"] == pytest.approx(3600, abs=1)
    assert run["billed_disk_only_s"] == pytest.approx(7200, abs=1)
    assert run["cost_so_far"] == pytest.approx(1.01 + 2 * 0.01, abs=0.001)
    assert run["final_cost"] is None
    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": True})
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "cancelled" and run["final_cost"] == pytest.approx(1.03, abs=0.001)


def test_usage_sums_runs_gpu_hours_and_cost_per_provider(harness: Harness, cloud: Cloud) -> None:
    project = harness.project_and_dataset()
    for _ in range(2):
        run_id = harness.create_run("memory", "mem-a10", project=project)
        harness.launch(run_id)
        harness.clock.advance(1800)
        harness.agent(run_id).train(smoke_adapter_zip())
    harness.create_run("memory", "mem-a10", project=project)  # a draft: never launched, not counted
    got = harness.ok("GET", "/api/usage", params={"since": "2000-01-01"})
    [row] = got["providers"]
    assert (row["provider"], row["runs"]) == ("memory", 2)
    assert row["gpu_hours"] == pytest.approx(1.0, abs=0.01) and row["cost"] == pytest.approx(1.01, abs=0.01)
    assert got["total"]["runs"] == 2 and got["total"]["cost"] == pytest.approx(row["cost"])
    assert harness.ok("GET", "/api/usage", params={"since": "2999-01-01"})["providers"] == []
    status, body, _ = harness.call("GET", "/api/usage", params={"since": "last tuesday"})
    assert status == 422 and "ISO date" in body["detail"]


def test_draft_patch_delete_and_price_warning_at_create(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10", price_limit=0.5)  # the offer costs 1.01/h
    draft = harness.get_run(run_id)
    assert draft["warnings"] and "above the price limit" in draft["warnings"][0]
    assert any(e["kind"] == "warning" for e in draft["events"])
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/launch", json_body={"confirm": True})
    assert status == 409 and "nothing was launched" in body["detail"]
    assert "now costs" not in body["detail"]  # the price never changed
    patched = harness.ok("PATCH", f"/api/runs/{run_id}", json_body={"price_limit_per_hour": 2.0, "runtime_limit_s": 600})
    assert (patched["price_limit_per_hour"], patched["runtime_limit_s"], patched["warnings"]) == (2.0, 600, [])
    status, body, _ = harness.call("PATCH", f"/api/runs/{run_id}", json_body={"offer_id": "nope"})
    assert status == 422 and "offer_id" in body["detail"]
    status, _, _ = harness.call("PATCH", f"/api/runs/{run_id}", json_body={"state": "succeeded"})
    assert status == 422  # not a field of a draft
    harness.launch(run_id)
    status, body, _ = harness.call("PATCH", f"/api/runs/{run_id}", json_body={"price_limit_per_hour": 3.0})
    assert status == 409 and "only a draft" in body["detail"]
    status, body, _ = harness.call("DELETE", f"/api/runs/{run_id}")
    assert status == 409 and "only a draft" in body["detail"]

    other = harness.create_run("memory", "mem-a10")
    status, _, _ = harness.call("DELETE", f"/api/runs/{other}")
    assert status == 204
    status, _, _ = harness.call("GET", f"/api/runs/{other}")
    assert status == 404


def test_unknown_provider_is_named_with_the_known_ones(harness: Harness, cloud: Cloud) -> None:
    pid, dsid = harness.project_and_dataset()
    status, body, _ = harness.call("POST", "/api/runs", json_body={
        "project_id": pid, "dataset_version_id": dsid, "provider": "no-such-cloud", "offer_id": "x",
        "base_model": "tensorant/smoke-tiny", "price_limit_per_hour": 1})
    assert status == 422
    assert "unknown provider 'no-such-cloud'" in body["detail"] and "aws" in body["detail"]
    assert "connection is saved" not in body["detail"]


def test_metrics_parse_progress_lines(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.5, [
        "trainer: starting", "progress=0.250 step=1 loss=2.5000 lr=0.0002", "progress=0.500 step=2 loss=2.1 lr=1e-4",
        "progress=0.600 step=3 loss=nan", "progress=0.700", "eval step=2 eval_loss=2.2000", "eval step=x eval_loss=1",
        "trainer: eval_loss after training = 1.9500"])
    got = harness.ok("GET", f"/api/runs/{run_id}/metrics")
    assert got["points"] == [{"step": 1, "loss": 2.5, "lr": 0.0002}, {"step": 2, "loss": 2.1, "lr": 0.0001}]
    assert got["eval_points"] == [{"step": 2, "eval_loss": 2.2}]  # the eval curve beside the loss
    assert got["eval_loss"] == 1.95
