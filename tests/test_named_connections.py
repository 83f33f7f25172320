"""Several compute connections of one provider under names (`memory`, `memory/b`), through the real
function handlers on the in-memory provider: saved, listed, checked, priced and deleted each on its own
beside the default one, whose routes work as before; a run names its connection; a sweep of one
connection never judges another's machines, even in one account."""

from __future__ import annotations

from typing import Any

import pytest

from shared.clock import now
from shared.providers.base import RunRef
from shared.services.steps import sweep_account
from shared.services.timers import sweeper
from shared.settings import get_settings
from shared.store import get_store
from tests.fakes import Cloud, Machine
from tests.harness import SMOKE_MODEL, ApiError, Harness, smoke_adapter_zip

NAMED = "/api/connections/compute/memory/named/b"


def _save_named(harness: Harness, path: str = NAMED, body: dict[str, Any] | None = None) -> Any:
    status, saved, _ = harness.call("PUT", path, json_body=body or {"account": "acct-1"})
    assert status == 202, saved
    harness.drain()
    return harness.ok("GET", path)


def _sweep(harness: Harness, connection: str, sweep_id: str) -> dict[str, Any]:
    return sweep_account.sweep_one(harness.ctx, harness.org, connection, sweep_id=sweep_id, dry_run=False)


def test_a_named_connection_is_saved_checked_and_priced_beside_the_default(harness: Harness, cloud: Cloud) -> None:
    conn = _save_named(harness)
    assert conn["status"] == "connected" and conn["name"] == "memory/b" and conn["provider"] == "memory"
    assert [c["name"] for c in conn["checks"]][-1] == "catalog"
    # The default is where it was, its row unchanged, and both are listed with their names.
    assert harness.ok("GET", "/api/connections/compute/memory")["name"] == "memory"
    listed = {c["name"]: c["slot"] for c in harness.ok("GET", "/api/connections")["items"] if c["name"]}
    assert listed == {"memory": "compute:memory", "memory/b": "compute:memory/b"}
    # Its own catalog row, its offers naming it; ?provider= shows every connection of the provider.
    assert get_store().catalogs.get(harness.org, "memory/b").connection == "memory/b"  # type: ignore[union-attr]
    only = harness.ok("GET", "/api/catalog/gpus", params={"connection": "memory/b"})
    assert [o["connection"] for o in only["items"]] == ["memory/b"]
    assert [c["connection"] for c in only["catalogs"]] == ["memory/b"]
    both = harness.ok("GET", "/api/catalog/gpus", params={"provider": "memory"})
    assert sorted(o["connection"] for o in both["items"]) == ["memory", "memory/b"]
    # A check of one runs that one's checks only.
    calls = len(cloud.calls)
    assert harness.call("POST", NAMED + "/check")[0] == 202
    harness.drain()
    assert cloud.calls[calls:].count("validate") == 1


def test_a_connection_named_check_is_not_the_check_route(harness: Harness, cloud: Cloud) -> None:
    conn = _save_named(harness, "/api/connections/compute/memory/named/check")
    assert conn["name"] == "memory/check" and conn["status"] == "connected"
    assert harness.call("POST", "/api/connections/compute/memory/named/check/check")[0] == 202
    assert harness.call("POST", "/api/connections/compute/memory/check")[0] == 202  # the default's, as before


@pytest.mark.parametrize(("path", "field"), [
    ("/api/connections/compute/memory/named/Bad_Name", "name"),
    ("/api/connections/compute/memory/named/" + "x" * 41, "name"),
    ("/api/connections/compute/nosuch/named/b", "provider"),
])
def test_a_bad_connection_name_is_refused_naming_the_field(harness: Harness, path: str, field: str) -> None:
    status, body, _ = harness.call("PUT", path, json_body={})
    assert status == 422, body
    assert field in str(body)
    assert {c["slot"] for c in harness.ok("GET", "/api/connections")["items"]} == {"storage", "compute:memory"}


def test_a_run_on_a_named_connection_launches_through_it(harness: Harness, cloud: Cloud) -> None:
    _save_named(harness)
    pid, dsid = harness.project_and_dataset()
    body = {"project_id": pid, "dataset_version_id": dsid, "provider": "memory", "offer_id": "mem-a10",
            "base_model": SMOKE_MODEL, "price_limit_per_hour": 10.0, "runtime_limit_s": 3600}
    with pytest.raises(ApiError) as err:  # a connection of another provider is refused by name
        harness.ok("POST", "/api/runs", token="member", json_body={**body, "connection": "aws/b"})
    assert err.value.status == 422 and "connection" in str(err.value.body)
    with pytest.raises(ApiError) as err:  # one not saved: said so, with how to save it
        harness.ok("POST", "/api/runs", token="member", json_body={**body, "connection": "memory/zz"})
    assert err.value.status == 422 and "memory/zz" in str(err.value.body)
    run_id = harness.ok("POST", "/api/runs", token="member", json_body={**body, "connection": "memory/b"})["id"]
    assert harness.launch(run_id)["state"] == "provisioning"
    [machine] = [m for m in cloud.machines.values() if m.tags.get("tensorant:run") == run_id]
    assert machine.tags["tensorant:connection"] == "memory/b"
    stored, _ = get_store().runs.get(harness.org, run_id)
    assert stored.connection == "memory/b"
    # Held by a run of memory/b: that one cannot be deleted, the default can.
    assert harness.call("DELETE", NAMED)[0] == 409
    harness.agent(run_id).train(smoke_adapter_zip())
    assert harness.get_run(run_id)["state"] == "succeeded"
    assert machine.state == "terminated"
    assert harness.call("DELETE", NAMED)[0] == 204
    assert harness.call("GET", NAMED)[0] == 404
    assert harness.ok("GET", "/api/connections/compute/memory")["status"] == "connected"


def test_a_sweep_of_one_connection_never_judges_anothers_machines(harness: Harness, cloud: Cloud) -> None:
    """Both connections reach one account (the in-memory cloud): each sweep lists every machine of
    the deployment and the org, and must judge only its own."""
    _save_named(harness)
    d = get_settings().deployment_id
    # A machine of memory/b whose run is missing (a leak): only memory/b's sweep may release it.
    leak_b = Machine(id="i-9001", tags=dict(RunRef(d, harness.org, "r-ghost-b", connection="memory/b").tags),
                     disk_id="vol-9001", created_at=now())
    cloud.machines[leak_b.id] = leak_b
    harness.clock.advance(get_settings().sweep_grace_s + 1)
    assert sorted(a for a in sweeper.accounts(harness.ctx) if a[0] == harness.org) == [
        (harness.org, "memory"), (harness.org, "memory/b")]
    out = _sweep(harness, "memory", "s20260101000000-aaaaaa")
    assert out["findings"] == [] and out["listed"] == 0 and leak_b.state == "running"
    out = _sweep(harness, "memory/b", "s20260101000000-bbbbbb")
    assert [(f["action"], f["run_id"], f["provider"]) for f in out["findings"]] == [
        ("release", "r-ghost-b", "memory/b")]
    assert leak_b.state == "terminated"
    # An admin's sweep fans out one message per connection: each sweeps its own, the leak is released once.
    leak_b.state = "running"
    leak_b.disk_exists = True
    started = sweeper.fan_out(harness.ctx, report=True)
    harness.drain()
    report = sweeper.report(harness.ctx, started["sweep_id"])
    assert report["finished"] and report["accounts"] == started["accounts"] >= 2
    assert [(f["provider"], f["run_id"]) for f in report["findings"] if f["action"] == "release"] == [
        ("memory/b", "r-ghost-b")]
    assert leak_b.state == "terminated"


def test_rows_saved_before_names_read_as_the_default_connection(harness: Harness) -> None:
    """No migration: the default connection's row is keyed as it always was, and a catalog row or a run
    written before names existed (no `connection`) reads as the provider's default."""
    from shared.models import CatalogRecord
    from shared.runs.org_backends import run_connection
    from tests.fakes import OFFER

    store = get_store()
    assert store.table("connections").get(harness.org, "compute~memory") is not None  # the key of old
    store.catalogs.put(CatalogRecord(org=harness.org, provider="memory", offers=[OFFER], fetched_at=now()))
    [offer] = harness.ok("GET", "/api/catalog/gpus", params={"provider": "memory"})["items"]
    assert offer["connection"] == "memory" and offer["offer_id"] == OFFER.offer_id
    run_id = harness.create_run("memory", OFFER.offer_id)
    run, _ = store.runs.get(harness.org, run_id)
    assert run.connection == "" and run_connection(run) == "memory"
