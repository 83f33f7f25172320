"""Monthly budgets: committed spend (billed this month + the most active runs can still cost) holds every
launch, atomically; thresholds are told and, with stop_at_budget, active runs are retained."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.fakes import OFFER, Cloud, TwoOffers, serve_memory
from tests.harness import Harness
from tests.webhook_receiver import Receiver

HOUR_COST = OFFER.total_per_hour  # the memory offer, 1.01 USD/h


def set_limits(harness: Harness, **limits: Any) -> Any:
    return harness.ok("PUT", "/api/org/limits", json_body=limits)


def budget(harness: Harness, name: str = "organization") -> dict[str, Any]:
    found = [b for b in harness.ok("GET", "/api/usage")["budget"]["budgets"] if b["name"] == name]
    assert found, name
    return dict(found[0])


def test_a_budget_of_one_dollar_refuses_a_launch_whose_maximum_passes_it(harness: Harness) -> None:
    set_limits(harness, monthly_budget_usd=1.0)
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=3600)  # up to 1.01 USD
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    assert status == 409, body
    detail = body["detail"]
    assert "monthly budget of 1.00 USD" in detail and "1.01 USD" in detail and "1.00 USD is left" in detail
    assert harness.get_run(run_id)["state"] == "draft"
    # Nothing was held by the refused launch: a shorter run fits.
    fits = harness.create_run("memory", "mem-a10", runtime_limit_s=3000)  # 0.84 USD
    assert harness.launch(fits)["state"] == "provisioning"
    b = budget(harness)
    assert b["budget_usd"] == 1.0 and 0.8 < b["committed_usd"] <= 0.85 and b["left_usd"] < 0.2


def test_two_launches_racing_for_the_last_dollars_one_passes(harness: Harness) -> None:
    set_limits(harness, monthly_budget_usd=1.5, max_active_runs=10)
    project = harness.project_and_dataset()
    runs = [harness.create_run("memory", "mem-a10", runtime_limit_s=3600, project=project) for _ in range(2)]
    results: list[int] = []
    barrier = threading.Barrier(2)

    def launch(run_id: str) -> None:
        barrier.wait()
        status, _, _ = harness.call("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
        results.append(status)

    threads = [threading.Thread(target=launch, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [202, 409]
    assert sorted(harness.get_run(r)["state"] for r in runs) == ["draft", "queued"]


def test_a_price_rise_between_create_and_launch_is_what_the_budget_holds(harness: Harness) -> None:
    from shared.store import get_store

    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=3600, price_limit=10.0)
    set_limits(harness, monthly_budget_usd=1.5)  # the draft's price (1.01/h) fits
    store = get_store()
    rec = store.catalogs.get(harness.org, "memory")
    assert rec is not None
    dearer = OFFER.model_copy(update={"compute_per_hour": 2.0, "total_per_hour": 2.01})
    store.catalogs.put(rec.model_copy(update={"offers": [dearer]}))
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    assert status == 409 and "2.01 USD" in body["detail"], body


def test_a_month_boundary_starts_the_budget_again(harness: Harness) -> None:
    harness.clock.t = datetime(2027, 1, 31, 22, 0, tzinfo=UTC).timestamp()
    set_limits(harness, monthly_budget_usd=2.0)
    project = harness.project_and_dataset()
    first = harness.create_run("memory", "mem-a10", runtime_limit_s=3600, project=project)
    harness.launch(first)
    harness.agent(first).heartbeat("training", 0.5)
    harness.clock.advance(1800)
    second = harness.create_run("memory", "mem-a10", runtime_limit_s=3600, project=project)
    status, body, _ = harness.call("POST", f"/api/runs/{second}/launch", token="member", json_body={"confirm": True})
    assert status == 409, body  # 1.01 held by the first + 1.01 > 2.00
    harness.ok("POST", f"/api/runs/{first}/cancel", token="member", json_body={"discard": True})
    harness.drain()
    january = budget(harness)
    assert january["billed_usd"] == pytest.approx(HOUR_COST / 2, rel=0.05) and january["held_usd"] == 0
    harness.clock.t = datetime(2027, 2, 1, 0, 1, tzinfo=UTC).timestamp()
    february = budget(harness)
    assert february["billed_usd"] == 0 and february["committed_usd"] == 0
    bigger = harness.create_run("memory", "mem-a10", runtime_limit_s=7000, project=project)  # 1.96 USD: only in February
    assert harness.launch(bigger)["state"] == "provisioning"


def test_a_project_budget_holds_its_project_only(harness: Harness) -> None:
    a = harness.project_and_dataset()
    b = harness.project_and_dataset()
    set_limits(harness, project_budgets_usd={a[0]: 0.5})
    status, body, _ = harness.call("POST", f"/api/runs/{harness.create_run('memory', 'mem-a10', project=a)}/launch",
                             token="member", json_body={"confirm": True})
    assert status == 409 and f"project {a[0]}'s monthly budget" in body["detail"]
    assert harness.launch(harness.create_run("memory", "mem-a10", project=b))["state"] == "provisioning"
    status, body, _ = harness.call("PUT", "/api/org/limits", json_body={"project_budgets_usd": {"../x": 1}})
    assert status == 422 and "project_budgets_usd" in str(body)
    status, body, _ = harness.call("PUT", "/api/org/limits", json_body={"budget_thresholds_pct": [0, 150]})
    assert status == 422 and "budget_thresholds_pct" in str(body)


def test_thresholds_are_told_and_stop_at_budget_retains(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.settings import reset_settings

    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")
    reset_settings()
    rx = Receiver()
    try:
        hook = harness.ok("POST", "/api/org/webhooks", json_body={"url": rx.url, "types": ["budget.threshold",
                                                                                   "run.retained"]})
        rx.secrets.append(hook["secret"])
        set_limits(harness, monthly_budget_usd=10.0)
        run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=7200)
        harness.launch(run_id)
        agent = harness.agent(run_id)
        agent.heartbeat("training", 0.1)
        set_limits(harness, monthly_budget_usd=1.0, stop_at_budget=True)  # an owner lowers it mid-run
        harness.clock.advance(40 * 60)  # 0.67 USD billed: past 50 %
        agent.heartbeat("training", 0.3)
        harness.tick("heartbeat_check")
        harness.drain()
        assert [e["body"]["data"]["threshold_pct"] for e in rx.events] == [50]
        harness.clock.advance(20 * 60)  # 1.01 USD: past 80 % and 100 %
        agent.heartbeat("training", 0.5)
        harness.tick("heartbeat_check")
        harness.drain()
        assert rx.types() == ["budget.threshold"] * 3 + ["run.retained"], rx.types()
        assert [e["body"]["data"]["threshold_pct"] for e in rx.events[:3]] == [50, 80, 100]
        assert not rx.refused
        run = harness.get_run(run_id)
        assert run["state"] == "retained" and "budget" in run["reason"]
        b = budget(harness)
        assert b["crossed_pct"] == [50, 80, 100] and b["billed_usd"] >= 1.0
        # A later tick tells nothing again.
        harness.clock.advance(600)
        harness.tick("heartbeat_check")
        harness.drain()
        assert len(rx.events) == 4
    finally:
        rx.stop()


def test_a_run_across_the_month_boundary_bills_each_month_its_share(harness: Harness) -> None:
    harness.clock.t = datetime(2027, 1, 31, 23, 0, tzinfo=UTC).timestamp()
    set_limits(harness, monthly_budget_usd=100.0)
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=3 * 3600)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.2)
    harness.clock.t = datetime(2027, 2, 1, 1, 0, tzinfo=UTC).timestamp()
    agent.heartbeat("training", 0.6)
    b = budget(harness)  # 2 h billed, one of them in February; 1 h of its runtime limit left
    assert b["billed_usd"] == pytest.approx(HOUR_COST, rel=0.02)
    assert b["held_usd"] == pytest.approx(HOUR_COST, rel=0.02)
    assert b["committed_usd"] == pytest.approx(2 * HOUR_COST, rel=0.02) and b["left_usd"] < 98


class TestTwoOffers:
    """Candidates on the memory provider with the A10 and an H100."""

    @pytest.fixture
    def cloud(self) -> Iterator[Cloud]:
        yield from serve_memory(Cloud(), TwoOffers)

    def test_a_launch_is_held_to_its_dearest_candidate(self, harness: Harness) -> None:
        """Issue 37 x 39: the launch may end on any candidate, so the budget holds its dearest (the H100, 3.01/h),
        not the first (the A10, 1.01/h, which alone would fit)."""
        set_limits(harness, monthly_budget_usd=2.0)
        pid, dsid = harness.project_and_dataset()
        run = harness.ok("POST", "/api/runs", token="member", json_body={
            "project_id": pid, "dataset_version_id": dsid, "base_model": "tensorant/smoke-tiny",
            "price_limit_per_hour": 5.0, "runtime_limit_s": 3600,
            "candidates": [{"connection": "memory", "offer_id": "mem-a10"}, {"connection": "memory", "offer_id": "mem-h100"}]})
        status, body, _ = harness.call("POST", f"/api/runs/{run['id']}/launch", token="member", json_body={"confirm": True})
        assert status == 409 and "3.01 USD" in body["detail"], body
        assert harness.get_run(run["id"])["state"] == "draft"
