"""A quickstart run on the local provider, served by the dev host (queues polled as the Functions host does),
tells run.queued, run.training and run.succeeded to a receiver on loopback that verifies every request with
the `standardwebhooks` package; the delivery latency after each state change is measured against an agent
heartbeat's round trip on the same host (printed: `pytest -s tests/e2e/test_webhooks_local_e2e.py`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from tests.e2e.local_host import TERMINAL_OR_RETAINED, Client
from tests.e2e.test_local_e2e import setup_org, start_run
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.e2e


@pytest.fixture
def loopback_ok(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")  # the receiver is on loopback http (test-only)


@pytest.fixture
def rx() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def test_a_local_quickstart_tells_each_state_signed(loopback_ok: None, api: Client, rx: Receiver) -> None:
    import requests

    from shared.security import mint_agent_token

    hook = api("POST", "/api/org/webhooks", json={"url": rx.url})
    rx.secrets.append(hook["secret"])
    run_id = start_run(api, *setup_org(api))
    heartbeat_s: list[float] = []
    deadline = time.monotonic() + 90
    while "run.training" not in rx.types() and time.monotonic() < deadline:
        time.sleep(0.05)
    # An agent heartbeat's round trip on the same host (a phase behind the run's: it moves nothing).
    token = mint_agent_token("org-a", run_id)
    for _ in range(5):
        t0 = time.monotonic()
        r = requests.post(f"{api.url}/api/agent/runs/{run_id}/heartbeat", json={"phase": "provisioning"},
                          headers={"Authorization": f"Bearer {token}"}, timeout=30)
        if r.status_code == 200:
            heartbeat_s.append(time.monotonic() - t0)
    run = api.wait(f"/api/runs/{run_id}", lambda r: r["state"] in TERMINAL_OR_RETAINED)
    assert run["state"] == "succeeded", run
    deadline = time.monotonic() + 30
    while len(rx.events) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    # Deliveries run in parallel (the specification promises no order): each event's own timestamp orders them.
    told = sorted(rx.events, key=lambda e: e["body"]["timestamp"])
    assert [e["body"]["type"] for e in told] == ["run.queued", "run.training", "run.succeeded"], (
        rx.types(), rx.refused)
    assert not rx.refused and len({e["id"] for e in rx.events}) == 3
    assert all(e["body"]["data"]["run_id"] == run_id for e in rx.events)
    # Latency: from the transition's timeline entry to the receiver's clock (one machine, one clock).
    changed = {e["message"].split(":")[0].split(" -> ")[1]: datetime.fromisoformat(e["at"]).timestamp()
               for e in run["events"] if e["kind"] == "transition" and " -> " in e["message"]}
    latency = [e["received"] - changed[e["body"]["data"]["state"]] for e in rx.events]
    assert all(0 <= s < 10 for s in latency), latency
    med = statistics.median(latency)
    each = ", ".join(f"{s * 1000:.0f}" for s in latency)
    line = f"webhook delivery after the state change: median {med * 1000:.0f} ms ({each} ms)"
    if heartbeat_s:
        hb = statistics.median(heartbeat_s)
        line += f"; agent heartbeat round trip: median {hb * 1000:.0f} ms; ratio {med / hb:.1f}"
    print("\n" + line)
