"""Lists that scale: GET /api/runs a page at a time (limit, cursor, state and project filters) with
a bounded number of table requests whatever the org's history; a run's cost kept on its record
(the same figures as from its events); the like-run forecast from an index, never the org's runs;
the trainer's figures validated before they become a forecast's throughput."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from shared.context import invocation
from shared.ids import newest_first_id
from shared.models import RunRecord, RunState
from shared.services.api import usage
from shared.store import get_store
from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip


@contextmanager
def table_requests() -> Iterator[list[str]]:
    """Every HTTP request the Storage clients send meanwhile (method and URL), however they are made."""
    from azure.core.pipeline.transport import RequestsTransport

    sent: list[str] = []
    original = RequestsTransport.send

    def counting(self: Any, request: Any, **kw: Any) -> Any:
        sent.append(f"{request.method} {request.url}")
        return original(self, request, **kw)

    RequestsTransport.send = counting  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        RequestsTransport.send = original  # type: ignore[method-assign]


def seed(harness: Harness, template: RunRecord, n: int, *, state: RunState = RunState.succeeded,
         project: str | None = None, old_ids: bool = False) -> list[str]:
    """n copies of a run record, each created a minute after the last (old_ids: random ids, as before
    newest-first ids existed, and no billing on the record)."""
    ids = []
    for _ in range(n):
        harness.clock.advance(60)
        rid = f"r-{secrets.token_hex(6)}" if old_ids else newest_first_id("r")
        rec = template.model_copy(update={
            "id": rid, "state": state, "project_id": project or template.project_id,
            "billing": None if old_ids else template.billing})
        get_store().runs.create(rec)
        ids.append(rid)
    return ids


def all_pages(harness: Harness, **params: str) -> tuple[list[str], int]:
    ids: list[str] = []
    pages = 0
    cursor = ""
    while True:
        got = harness.ok("GET", "/api/runs", params={**params, **({"cursor": cursor} if cursor else {})})
        pages += 1
        ids += [r["id"] for r in got["items"]]
        if got["next"] is None:
            return ids, pages
        cursor = got["next"]
        assert pages < 100


def test_runs_list_pages_every_run_once_newest_first_with_filters(harness: Harness, cloud: Cloud) -> None:
    first = harness.create_run("memory", "mem-a10")
    template, _ = get_store().runs.get(harness.org, first)
    other_project = harness.project_and_dataset()[0]
    old = seed(harness, template, 3, old_ids=True)  # before newest-first ids: listed after the others
    done = seed(harness, template, 40)
    failed = seed(harness, template, 25, state=RunState.failed, project=other_project)
    newest = seed(harness, template, 10, state=RunState.draft)

    ids, pages = all_pages(harness, limit="20")
    assert sorted(ids) == sorted([first, *old, *done, *failed, *newest])  # each exactly once
    assert len(ids) == len(set(ids)) and pages == 4  # 79 runs in pages of 20
    assert ids[:10] == newest[::-1] and ids[10:35] == failed[::-1] and ids[35:75] == done[::-1]
    assert set(ids[-3:]) == set(old)
    assert harness.ok("GET", "/api/runs")["next"] is not None  # the default page is 50 of 79

    ids, _ = all_pages(harness, limit="7", state="failed")
    assert ids == failed[::-1]
    ids, _ = all_pages(harness, limit="200", state="failed,draft")
    assert ids == newest[::-1] + failed[::-1] + [first]  # first: a draft too, the oldest
    ids, _ = all_pages(harness, project=other_project)
    assert ids == failed[::-1]
    ids, _ = all_pages(harness, project=other_project, state="succeeded")
    assert ids == []


def test_a_bad_cursor_or_limit_is_refused_naming_it(harness: Harness, cloud: Cloud) -> None:
    template, _ = get_store().runs.get(harness.org, harness.create_run("memory", "mem-a10"))
    seed(harness, template, 3)
    nxt = harness.ok("GET", "/api/runs", params={"limit": "2"})["next"]
    body, sig = nxt.rsplit(".", 1)
    for bad in (nxt[:-1] + ("A" if nxt[-1] != "A" else "B"), "cg." + sig, "not-a-cursor", "%%%.x", "x" * 500):
        status, got, _ = harness.call("GET", "/api/runs", params={"limit": "2", "cursor": bad})
        assert status == 400 and got["errors"][0]["field"] == "cursor", (bad, got)
    # A cursor of the unfiltered list does not position a filtered one.
    status, got, _ = harness.call("GET", "/api/runs", params={"limit": "2", "cursor": nxt, "state": "draft"})
    assert status == 400 and got["errors"][0]["field"] == "cursor"
    for limit in ("0", "201", "-1", "ten"):
        status, got, _ = harness.call("GET", "/api/runs", params={"limit": limit})
        assert status == 422 and got["errors"][0]["field"] == "limit"
    status, got, _ = harness.call("GET", "/api/runs", params={"state": "nope"})
    assert status == 422 and got["errors"][0]["field"] == "state"
    assert harness.ok("GET", "/api/runs", params={"limit": "2", "cursor": nxt})["items"]


def test_runs_list_costs_the_same_requests_for_10_or_300_runs(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.clock.advance(600)
    harness.agent(run_id).train(smoke_adapter_zip())
    template, _ = get_store().runs.get(harness.org, run_id)
    assert template.billing is not None and template.state == RunState.succeeded
    seed(harness, template, 9)

    def requests_of_a_page() -> list[str]:
        with table_requests() as sent:
            got = harness.ok("GET", "/api/runs", params={"limit": "50"})
        assert all(item["final_cost"] == pytest.approx(got["items"][0]["final_cost"]) for item in got["items"])
        return sent

    few = requests_of_a_page()
    seed(harness, template, 290)
    many = requests_of_a_page()
    # One query of the runs table (a second for the older ids' range when the page is not full); no event read.
    assert len(few) <= 2 and len(many) <= 2, (few, many)
    assert all(get_store().table("runs").name in s for s in few + many)
    with table_requests() as sent:
        got = harness.ok("GET", "/api/usage", params={"since": "2000-01-01"})
    assert got["total"]["runs"] == 300
    assert not [s for s in sent if "events" in s]  # the cost is on each record


def compare_paths(run_id: str) -> usage.Timing:
    """The billing figures from the record equal the figures from the events."""
    ctx = invocation()
    run, _ = ctx.store.runs.get("org-a", run_id)
    assert run.billing is not None
    from_record = usage.timing(ctx, run)
    from_events = usage.timing(ctx, run.model_copy(update={"billing": None}))
    assert from_record == from_events, (from_record, from_events)
    return from_record


def test_billing_on_the_record_matches_the_events_through_retain_recovery_start_stop_release(
        harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.clock.advance(3600)
    compare_paths(run_id)
    harness.agent(run_id).complete_failed("boom", exit_code=3)
    assert harness.get_run(run_id)["state"] == "retained"
    harness.clock.advance(1800)
    t = compare_paths(run_id)
    assert (t.machine_s, t.disk_only_s, t.machine_running) == (pytest.approx(3600, abs=1), 1800, False)
    harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    harness.clock.advance(600)
    t = compare_paths(run_id)
    assert t.machine_running and t.machine_s == pytest.approx(4200, abs=1)
    harness.ok("POST", f"/api/runs/{run_id}/stop")
    harness.clock.advance(300)
    t = compare_paths(run_id)
    assert not t.machine_running and t.disk_only_s == pytest.approx(2100, abs=1)
    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": True})
    harness.drain()
    harness.clock.advance(7200)
    t = compare_paths(run_id)
    assert harness.get_run(run_id)["state"] == "cancelled" and t.final_cost is not None
    assert t.machine_s == pytest.approx(4200, abs=1) and t.disk_only_s == pytest.approx(2100, abs=1)
    listed = harness.ok("GET", "/api/runs")["items"][0]
    assert listed["id"] == run_id and listed["final_cost"] == pytest.approx(t.final_cost)


def test_a_record_from_before_billing_still_costs_from_its_events(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.clock.advance(3600)
    harness.agent(run_id).complete_failed("boom", exit_code=3)
    harness.clock.advance(1800)
    store = get_store()
    store.runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"billing": None}))
    run = harness.get_run(run_id)
    assert run["billed_machine_s"] == pytest.approx(3600, abs=1) and run["billed_disk_only_s"] == pytest.approx(1800)


# ---------------------------------------------------------------- the like-run index


def test_create_reads_the_like_run_index_not_the_orgs_runs(harness: Harness, cloud: Cloud) -> None:
    project = harness.project_and_dataset(rows=40)
    first = harness.create_run("memory", "mem-a10", project=project, training={"max_steps": 6})
    harness.launch(first)
    harness.agent(first).train(smoke_adapter_zip(measured={"train_seconds": 200.0, "tokens": 600, "steps": 6}))
    assert harness.get_run(first)["state"] == "succeeded"
    with table_requests() as sent:
        like = harness.get_run(harness.create_run("memory", "mem-a10", project=project, training={"max_steps": 6}))
    assert f"measured by run {first}" in like["forecast"]["basis"]
    runs_table = get_store().table("runs").name
    queries = [s for s in sent if f"/{runs_table}()" in s and s.startswith("GET")]
    assert queries == [], queries  # the index is one point read; no query of the org's runs


@pytest.mark.parametrize("measured", [
    {"train_seconds": 100, "tokens": 1},  # 0.01 tokens/s: rounded to 0, a division by zero at the next create
    {"train_seconds": float("inf"), "tokens": 600},
    {"train_seconds": 1e-9, "tokens": 10**12},
])
def test_trainer_figures_out_of_range_are_ignored_with_an_event_never_a_500(
        harness: Harness, cloud: Cloud, measured: dict[str, Any]) -> None:
    project = harness.project_and_dataset(rows=40)
    first = harness.create_run("memory", "mem-a10", project=project, training={"max_steps": 6})
    harness.launch(first)
    harness.agent(first).train(smoke_adapter_zip(measured={**measured, "steps": 6}))
    done = harness.get_run(first)
    assert done["state"] == "succeeded" and done["forecast_check"] is None
    assert any("not taken as a measurement" in e["message"] for e in done["events"] if e["kind"] == "warning")
    pid, dsid = project
    for _ in range(2):  # create, and an edit, with the same settings
        status, got, _ = harness.call("POST", "/api/runs", token="member", json_body={
            "project_id": pid, "dataset_version_id": dsid, "provider": "memory", "offer_id": "mem-a10",
            "base_model": "tensorant/smoke-tiny", "price_limit_per_hour": 100.0, "training": {"max_steps": 6}})
        assert status == 201, got
        assert "measured by run" not in got["forecast"]["basis"]
        status, got, _ = harness.call("PATCH", f"/api/runs/{got['id']}", token="member", json_body={"runtime_limit_s": 900})
        assert status == 200, got


def test_a_stored_zero_throughput_is_never_divided_by(harness: Harness, cloud: Cloud) -> None:
    """An index row written before the figures were validated (or by hand) is ignored, not a 500."""
    from shared.runs import forecast

    project = harness.project_and_dataset(rows=40)
    run_id = harness.create_run("memory", "mem-a10", project=project, training={"max_steps": 6})
    run, _ = get_store().runs.get(harness.org, run_id)
    key = forecast.like_key(run.provider, run.base_model, run.offer.gpu, run.training)
    for rate in (0, 0.0, float("inf"), -1, "3"):
        get_store().throughput.put(harness.org, key, {"run_id": run_id, "tokens_per_s": rate})
        assert forecast.measured_for(harness.ctx, harness.org, run.provider, run.base_model, run.offer.gpu, run.training) is None
    got = harness.get_run(harness.create_run("memory", "mem-a10", project=project, training={"max_steps": 6}))
    assert "measured by run" not in got["forecast"]["basis"]


def test_cli_runs_list_pages_with_a_cursor_hint_or_all(harness: Harness, cloud: Cloud, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_cli import main as cli

    class HarnessClient:
        def __init__(self, url: str = "", token: str | None = None) -> None:
            pass

        def get(self, path: str, **params: str) -> Any:
            return harness.ok("GET", path, params={k: v for k, v in params.items() if v})

    template, _ = get_store().runs.get(harness.org, harness.create_run("memory", "mem-a10"))
    ids = [*seed(harness, template, 4)[::-1], template.id]
    monkeypatch.setattr(cli, "Client", HarnessClient)
    assert cli.main(["runs", "list", "--limit", "2", "-q"]) == 0
    out, err = capsys.readouterr()
    assert out.split() == ids[:2] and "more: tensorant runs list --cursor " in err
    cursor = err.split("--cursor ")[1].split()[0]
    assert cli.main(["runs", "list", "--limit", "2", "-q", "--cursor", cursor]) == 0
    assert capsys.readouterr().out.split() == ids[2:4]
    assert cli.main(["runs", "list", "--limit", "2", "--all", "-q"]) == 0
    out, err = capsys.readouterr()
    assert out.split() == ids and "more:" not in err
    assert cli.main(["runs", "list", "--state", "draft", "-q"]) == 0
    assert capsys.readouterr().out.split() == [template.id]


def test_projects_and_datasets_lists_are_paged_too(harness: Harness, cloud: Cloud) -> None:
    made = [harness.ok("POST", "/api/projects", json_body={"name": f"p{i}"})["id"] for i in range(5)]
    seen: list[str] = []
    cursor = ""
    while True:
        got = harness.ok("GET", "/api/projects", params={"limit": "2", **({"cursor": cursor} if cursor else {})})
        seen += [p["id"] for p in got["items"]]
        if not got["next"]:
            break
        cursor = got["next"]
    assert sorted(seen) == sorted(made) and len(seen) == len(set(seen))
    status, body, _ = harness.call("GET", f"/api/projects/{made[0]}/datasets", params={"cursor": cursor or "x.y"})
    assert status == 400 and body["errors"][0]["field"] == "cursor"  # a projects cursor is not a datasets one
    assert harness.ok("GET", f"/api/projects/{made[0]}/datasets") == {"items": [], "next": None}
