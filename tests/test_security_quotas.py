"""Owner-set per-org limits, enforced at create and launch, and a run rate limit.

Before: a member created 25 drafts with a 1000 $/h price limit and a 7-day runtime in 4 s.
"""

from __future__ import annotations

import threading
from typing import Any

from shared.services.api import quotas
from tests.harness import SMOKE_MODEL, Harness


def _create(harness: Harness, project: tuple[str, str], **over: Any) -> tuple[int, Any, dict[str, str]]:
    body = {"project_id": project[0], "dataset_version_id": project[1], "provider": "memory", "offer_id": "mem-a10",
            "base_model": SMOKE_MODEL, "price_limit_per_hour": 5.0, "runtime_limit_s": 3600} | over
    return harness.call("POST", "/api/runs", token="member", json_body=body)


def test_org_limits_have_safe_defaults_and_only_owners_set_them(harness: Harness) -> None:
    assert harness.ok("GET", "/api/org/limits", token="member") == quotas.OrgLimits().model_dump()
    assert quotas.OrgLimits().max_price_limit_per_hour < 1000 and quotas.OrgLimits().max_runtime_limit_s < 7 * 86400
    status, _, _ = harness.call("PUT", "/api/org/limits", token="member", json_body={"max_active_runs": 50})
    assert status == 403
    got = harness.ok("PUT", "/api/org/limits", json_body={"max_active_runs": 2})
    assert got["max_active_runs"] == 2 and got["runs_per_minute"] == quotas.OrgLimits().runs_per_minute
    status, body, _ = harness.call("PUT", "/api/org/limits", json_body={"max_active_runs": 0, "surprise": 1})
    assert status == 422 and {e["field"] for e in body["errors"]} == {"max_active_runs", "surprise"}


def test_create_refuses_price_and_runtime_above_the_limits(harness: Harness) -> None:
    project = harness.project_and_dataset()
    harness.ok("PUT", "/api/org/limits", json_body={"max_price_limit_per_hour": 10, "max_runtime_limit_s": 7200})
    status, body, _ = _create(harness, project, price_limit_per_hour=1000.0, runtime_limit_s=7 * 86400)
    assert status == 422
    assert {e["field"] for e in body["errors"]} == {"price_limit_per_hour", "runtime_limit_s"}
    assert "organization's limit of 10/h" in body["detail"]
    status, _, _ = _create(harness, project, price_limit_per_hour=10.0, runtime_limit_s=7200)
    assert status == 201


def test_launch_enforces_active_runs_and_lowered_limits(harness: Harness) -> None:
    project = harness.project_and_dataset()
    harness.ok("PUT", "/api/org/limits", json_body={"max_active_runs": 1})
    first = _create(harness, project)[1]["id"]
    second = _create(harness, project)[1]["id"]
    harness.ok("POST", f"/api/runs/{first}/launch", token="member", json_body={"confirm": True})
    status, body, _ = harness.call("POST", f"/api/runs/{second}/launch", token="member", json_body={"confirm": True})
    assert status == 409 and "limit 1" in body["detail"], body
    assert harness.ok("GET", f"/api/runs/{second}")["state"] == "draft"
    # A draft saved under looser limits is checked again at launch.
    harness.ok("PUT", "/api/org/limits", json_body={"max_active_runs": 5, "max_price_limit_per_hour": 1})
    status, body, _ = harness.call("POST", f"/api/runs/{second}/launch", token="member", json_body={"confirm": True})
    assert status == 422 and body["errors"][0]["field"] == "price_limit_per_hour"


def test_run_creation_is_rate_limited_with_retry_after_across_instances(harness: Harness) -> None:
    from shared.store import reset_store

    project = harness.project_and_dataset()
    harness.ok("PUT", "/api/org/limits", json_body={"runs_per_minute": 3})
    harness.clock.t = (int(harness.clock.t // 60) * 60) + 1.0  # the start of a window
    for _ in range(2):
        assert _create(harness, project)[0] == 201
    reset_store()  # another host instance: a new store client, the same table
    assert _create(harness, project)[0] == 201
    status, body, headers = _create(harness, project)
    assert status == 429 and body["title"] == "Too many requests"
    assert "more than 3 run creates in a minute" in body["detail"]
    assert 1 <= int(headers["Retry-After"]) <= 60
    harness.clock.t += 60  # the next window
    assert _create(harness, project)[0] == 201


def test_rate_limit_counts_exactly_under_concurrency(harness: Harness) -> None:
    harness.clock.t = (int(harness.clock.t // 60) * 60) + 1.0
    results: list[str] = []

    def take() -> None:
        try:
            quotas._take(harness.ctx, harness.org, "create", 4)
            results.append("ok")
        except quotas.TooManyRequests:
            results.append("429")

    threads = [threading.Thread(target=take) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["429"] * 6 + ["ok"] * 4


def test_no_429_below_the_limit_under_contention(harness: Harness) -> None:
    # 30 requests at once with room for all of them: losing an ETag race is not "too many".
    harness.clock.t = (int(harness.clock.t // 60) * 60) + 1.0
    results: list[str] = []
    start = threading.Barrier(30)

    def take() -> None:
        start.wait()
        try:
            quotas._take(harness.ctx, harness.org, "launch", 1000)
            results.append("ok")
        except quotas.TooManyRequests as exc:
            results.append(f"429: {exc}")

    threads = [threading.Thread(target=take) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["ok"] * 30, [r for r in results if r != "ok"]


def test_release_check_recover_and_upload_url_are_rate_limited(harness: Harness) -> None:
    from tests.harness import smoke_adapter_zip

    project = harness.project_and_dataset()
    retained = []
    for _ in range(2):
        run_id = harness.create_run("memory", "mem-a10", project=project)
        harness.launch(run_id)
        harness.agent(run_id).heartbeat("training", 0.5)
        retained.append(run_id)
    for run_id in retained:
        assert harness.expire(run_id)["state"] == "retained"
    harness.ok("PUT", "/api/org/limits", json_body={"runs_per_minute": 1})
    harness.clock.t = (int(harness.clock.t // 60) * 60) + 1.0
    for path in ("/api/connections/compute/memory/check", f"/api/projects/{project[0]}/datasets/upload-url"):
        first, second = (harness.call("POST", path)[0] for _ in range(2))
        assert first != 429 and second == 429, (path, first, second)
    archive = smoke_adapter_zip()
    recovered = harness.call("POST", f"/api/runs/{retained[0]}/recover", body=archive, content_type="application/zip")
    refused = harness.call("POST", f"/api/runs/{retained[1]}/recover", body=archive, content_type="application/zip")
    assert recovered[0] < 400 and refused[0] == 429, (recovered[:2], refused[:2])
    assert "recovery archives) in a minute" in refused[1]["detail"]  # an upload: counted as one first


def test_no_owner_can_raise_a_limit_past_the_operators_ceiling(harness: Harness, monkeypatch) -> None:
    """Before: an owner set runs_per_minute and max_active_runs to 1,000 and one org's uploads slowed the others'."""
    from shared.runs.org_limits import CEILINGS
    from shared.settings import get_settings, reset_settings

    for field, (setting, _) in CEILINGS.items():
        too_high = getattr(get_settings(), setting) + 1
        status, body, _ = harness.call("PUT", "/api/org/limits", json_body={field: too_high})
        assert status == 422 and [e["field"] for e in body["errors"]] == [field], (field, body)
        assert "ceiling" in body["detail"]
    assert harness.ok("GET", "/api/org/limits") == quotas.OrgLimits().model_dump()  # nothing was saved
    harness.ok("PUT", "/api/org/limits", json_body={"runs_per_minute": 20, "max_active_runs": 20})
    # The operator lowers the ceilings afterwards: they bind at once, on the saved values too.
    monkeypatch.setenv("TENSORANT_ORG_RUNS_PER_MINUTE_CEILING", "2")
    monkeypatch.setenv("TENSORANT_ORG_MAX_ACTIVE_RUNS_CEILING", "3")
    reset_settings()
    got = harness.ok("GET", "/api/org/limits")
    assert got["runs_per_minute"] == 2 and got["max_active_runs"] == 3


def test_heavy_routes_are_limited_by_the_ceiling(harness: Harness, monkeypatch) -> None:
    from shared.settings import reset_settings

    harness.ok("PUT", "/api/org/limits", json_body={"runs_per_minute": 20})
    monkeypatch.setenv("TENSORANT_ORG_RUNS_PER_MINUTE_CEILING", "2")
    reset_settings()
    pid, _ = harness.project_and_dataset()  # the minute's first upload
    line = b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}'
    codes = [harness.call("POST", f"/api/projects/{pid}/datasets", token="member", body=line,
                    content_type="application/x-ndjson")[0] for _ in range(2)]
    assert codes == [201, 429], codes
