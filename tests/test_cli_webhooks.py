"""`tensorant webhooks ...` and the budgets in `tensorant usage`: the requests the CLI sends and what it prints."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fake_api import FakeApi, run_cli

HOOK: dict[str, Any] = {
    "id": "wh-0123456789ab", "url": "https://hooks.example.com/t", "types": ["run.succeeded"], "enabled": True,
    "description": "", "created_at": "2026-12-06T00:00:00Z", "rotated_at": None,
        "previous_secret_valid_until": None, "failing_since": None, "last_success_at": None, "notice": ""}
SECRET = "whsec_" + "A" * 43 + "="


def test_add_prints_the_secret_once_and_list_never(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("POST", "/api/org/webhooks", {**HOOK, "secret": SECRET}, status=201)
    assert run_cli(fake_api, "webhooks", "add", HOOK["url"], "--types", "run.succeeded, run.failed") == 0
    [sent] = fake_api.sent("POST", "/api/org/webhooks")
    assert json.loads(sent["body"]) == {"url": HOOK["url"], "enabled": True, "description": "",
                                        "types": ["run.succeeded", "run.failed"]}
    out = capsys.readouterr().out
    assert out.count(SECRET) == 1 and "shown once" in out
    disabled = {**HOOK, "enabled": False, "notice": "disabled on 2026-12-11: every delivery since ... failed"}
    fake_api.on("GET", "/api/org/webhooks", {"items": [HOOK, disabled], "limit": 10})
    assert run_cli(fake_api, "webhooks", "list") == 0
    out = capsys.readouterr().out
    assert "wh-0123456789ab" in out and "no: disabled on 2026-12-11" in out and "whsec_" not in out


def test_rotate_test_deliveries_enable_delete(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    base = "/api/org/webhooks/wh-0123456789ab"
    fake_api.on("POST", f"{base}/rotate", {**HOOK, "secret": SECRET, "previous_secret_valid_until": "2026-12-07T00:00:00Z"})
    fake_api.on("POST", f"{base}/test", {"queued": True, "webhook_id": "msg_abcdefgh12", "type": "webhook.test"},
                status=202)
    fake_api.on("GET", f"{base}/deliveries", {"items": [
        {"at": "2026-12-06T00:00:05Z", "webhook_id": "msg_abcdefgh12", "type": "webhook.test", "attempt": 2,
         "outcome": "delivered", "status_code": 204, "error": "", "duration_ms": 12},
        {"at": "2026-12-06T00:00:00Z", "webhook_id": "msg_abcdefgh12", "type": "webhook.test", "attempt": 1,
         "outcome": "retrying", "status_code": None, "error": "timed out after 10 s", "duration_ms": 10000}]})
    fake_api.on("PATCH", base, {**HOOK, "enabled": True})
    fake_api.on("DELETE", base, None, status=204)
    assert run_cli(fake_api, "webhooks", "rotate", "wh-0123456789ab") == 0
    out = capsys.readouterr().out
    assert SECRET in out and "also signs until 2026-12-07" in out
    assert run_cli(fake_api, "webhooks", "test", "wh-0123456789ab") == 0
    assert "msg_abcdefgh12" in capsys.readouterr().out
    assert run_cli(fake_api, "webhooks", "deliveries", "wh-0123456789ab") == 0
    out = capsys.readouterr().out
    assert "delivered" in out and "204" in out and "timed out after 10 s" in out
    assert run_cli(fake_api, "webhooks", "enable", "wh-0123456789ab") == 0
    assert json.loads(fake_api.sent("PATCH", base)[0]["body"]) == {"enabled": True}
    assert run_cli(fake_api, "webhooks", "delete", "wh-0123456789ab") == 0
    assert fake_api.sent("DELETE", base)


def test_a_refused_url_is_the_apis_message(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("POST", "/api/org/webhooks", {"title": "Invalid input", "status": 422,
                                              "detail": "url: the endpoint resolves to a non-public address",
                                              "errors": [{"field": "url", "message": "non-public address"}]},
                status=422, ctype="application/problem+json")
    assert run_cli(fake_api, "webhooks", "add", "https://10.0.0.1/x") == 1
    assert "non-public" in capsys.readouterr().err


def test_usage_shows_the_budgets(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("GET", "/api/usage", {"since": "2026-11-06", "providers": [], "total": {}, "budget": {
        "month": "2026-12", "stop_at_budget": True, "budgets": [
            {"name": "organization", "budget_usd": 100.0, "billed_usd": 42.5, "held_usd": 20.0,
             "committed_usd": 62.5, "left_usd": 37.5, "forecast_usd": 50.0, "thresholds_pct": [50, 80, 100],
             "crossed_pct": []},
            {"name": "project p1", "budget_usd": 10.0, "billed_usd": 9.0, "held_usd": 0, "committed_usd": 9.0,
             "left_usd": 1.0, "forecast_usd": 9.0, "thresholds_pct": [50, 80, 100], "crossed_pct": [50, 80]}]}})
    assert run_cli(fake_api, "usage") == 0
    out = capsys.readouterr().out
    assert "budgets for 2026-12" in out and "retained at 100 %" in out
    assert "$62.50" in out and "$37.50" in out and "50%,80%" in out
