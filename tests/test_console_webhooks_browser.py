"""The console's Webhooks page (the secret shown once, a test event, the delivery log) and a budget refusal
on the run page and the Usage page, in real headless Chromium against a started local host
(tests/console/webhooks_driver.mjs)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from standardwebhooks import Webhook

from tests.e2e.local_host import ROOT, Client, LocalHost
from tests.test_console_browser import CHROMIUM, SHOTS, _browser_or_skip
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.e2e
DRIVER = ROOT / "tests" / "console" / "webhooks_driver.mjs"


@pytest.fixture
def host(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHost]:
    from tests.e2e.local_host import start_local_host

    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")  # the receiver on loopback http (test-only)
    yield from start_local_host(monkeypatch, f"{sys.executable} -m machine.trainer.smoke")


def drive(scenario: str, **args: Any) -> dict[str, Any]:
    _browser_or_skip()
    SHOTS.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"chromium": CHROMIUM, "shots": str(SHOTS), **args})
    proc = subprocess.run(["node", str(DRIVER), scenario, payload], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"driver exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"], result["error"] + "\n" + "\n".join(result["problems"])
    assert result["problems"] == [], result["problems"]
    return result


def test_a_webhook_added_in_the_console_receives_a_signed_test(host: LocalHost) -> None:
    rx = Receiver()
    try:
        got = drive("webhooks", url=host.url, token=host.token, receiver=rx.url)
        assert got["secret"].startswith("whsec_") and not got["secretShownAgain"]
        assert "delivered" in got["log"] and "webhook.test" in got["log"]
        [sent] = rx.requests
        assert Webhook(got["secret"]).verify(sent["body"], sent["headers"])["type"] == "webhook.test"
    finally:
        rx.stop()


def test_the_console_says_why_a_budget_refused_a_launch(host: LocalHost) -> None:
    from tests.e2e.test_local_e2e import setup_org

    api = Client(host.url, host.token)
    project, dataset = setup_org(api)
    api("PUT", "/api/connections/compute/local", json={"price_per_hour": 2.0})
    api.wait("/api/connections/compute/local", lambda c: c["status"] != "checking", 30)
    api("PUT", "/api/org/limits", json={"monthly_budget_usd": 1.0})
    offer = api("GET", "/api/catalog/gpus?provider=local")["items"][0]
    run = api("POST", "/api/runs", json={"project_id": project, "dataset_version_id": dataset, "provider": "local",
                                         "offer_id": offer["offer_id"], "base_model": "tensorant/smoke-tiny",
                                         "price_limit_per_hour": 5.0, "runtime_limit_s": 3600})
    got = drive("budget", url=host.url, token=host.token, run_id=run["id"])
    assert "monthly budget of 1.00 USD" in got["refusal"] and "is left" in got["refusal"], got["refusal"]
    assert "1.00 USD" in got["usage"] and "organization" in got["usage"]
    assert api("GET", f"/api/runs/{run['id']}")["state"] == "draft"
