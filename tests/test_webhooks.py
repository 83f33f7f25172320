"""Signed webhooks end to end: endpoints through the API, deliveries through the deliver-webhook step and
Azurite, a receiver on loopback that verifies each request with the `standardwebhooks` package."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip
from tests.webhook_receiver import Receiver


@pytest.fixture
def loopback_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    # The receiver is on loopback http: the test-only allowance (production refuses to start with it).
    from shared.settings import reset_settings

    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")
    reset_settings()


@pytest.fixture
def rx() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def add_hook(harness: Harness, rx: Receiver, **kw: Any) -> dict[str, Any]:
    created = harness.ok("POST", "/api/org/webhooks", json_body={"url": rx.url, **kw})
    assert created["secret"].startswith("whsec_")
    rx.secrets.append(created["secret"])
    return dict(created)


def test_a_run_tells_every_state_change_signed(env: dict[str, str], loopback_ok: None, cloud: Cloud,
                                               rx: Receiver) -> None:
    h = Harness()
    try:
        h.save_storage({"kind": "local"})
        h.save_compute("memory", {})
        hook = add_hook(h, rx)
        listed = h.ok("GET", "/api/org/webhooks")["items"]
        assert [x["id"] for x in listed] == [hook["id"]] and "secret" not in listed[0]
        assert "secret" not in h.ok("GET", f"/api/org/webhooks/{hook['id']}")
        run_id = h.create_run("memory", "mem-a10")
        h.launch(run_id)
        h.agent(run_id).train(smoke_adapter_zip())
        assert h.get_run(run_id)["state"] == "succeeded"
        assert rx.types() == ["run.queued", "run.training", "run.succeeded"], (rx.types(), rx.refused)
        assert not rx.refused
        ids = [e["id"] for e in rx.events]
        assert len(set(ids)) == 3
        done = rx.events[-1]["body"]
        assert done["data"]["run_id"] == run_id and done["data"]["state"] == "succeeded"
        assert done["data"]["org"] == h.org and done["data"]["cost"] is not None
        text = str(rx.events)
        assert hook["secret"] not in text and "http" not in str([e["body"] for e in rx.events])
        # The record keeps no notice once queued; the delivery log shows each attempt.
        log = h.ok("GET", f"/api/org/webhooks/{hook['id']}/deliveries")["items"]
        assert sorted(x["webhook_id"] for x in log) == sorted(ids)
        assert {x["outcome"] for x in log} == {"delivered"} and {x["status_code"] for x in log} == {204}
    finally:
        h.close()


def test_the_receiver_refuses_a_tampered_body_and_an_old_timestamp(env: dict[str, str], loopback_ok: None,
                                                                   harness: Harness, rx: Receiver) -> None:
    hook = add_hook(harness, rx)
    harness.ok("POST", f"/api/org/webhooks/{hook['id']}/test")
    harness.drain()
    [sent] = rx.requests
    assert rx.types() == ["webhook.test"]
    body, headers = sent["body"], sent["headers"]
    wh = Webhook(hook["secret"])
    assert wh.verify(body, headers)["type"] == "webhook.test"
    with pytest.raises(WebhookVerificationError):
        wh.verify(body.replace(b"webhook.test", b"webhook.tess"), headers)
    # A replay ten minutes later: re-signing it needs the secret, so the old signature goes with an old stamp.
    old = dict(headers, **{"webhook-timestamp": str(int(time.time()) - 600)})
    with pytest.raises(WebhookVerificationError, match="too old"):
        wh.verify(body, old)
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=").verify(body, headers)


def test_failures_retry_with_the_same_id_and_increasing_delays(env: dict[str, str], loopback_ok: None, harness: Harness,
                                                               rx: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.webhooks import send

    monkeypatch.setattr(send, "TIMEOUT_S", 0.5)
    rx.script = [500, 503, 0.8]  # two 500s, then a timeout, then 204
    hook = add_hook(harness, rx)
    t0 = harness.clock.t
    harness.ok("POST", f"/api/org/webhooks/{hook['id']}/test")
    harness.drain()
    assert len(rx.requests) == 4
    assert len({r["headers"]["webhook-id"] for r in rx.requests}) == 1
    assert rx.events and not rx.refused  # each verifies; the one answered in time was accepted
    log = harness.ok("GET", f"/api/org/webhooks/{hook['id']}/deliveries")["items"][::-1]
    assert [x["outcome"] for x in log] == ["retrying", "retrying", "retrying", "delivered"]
    assert [x["status_code"] for x in log] == [500, 503, None, 204]
    assert "timed out" in log[2]["error"]
    # Waited through the queue: 5 s, 5 min, 30 min of the simulated clock.
    assert harness.clock.t - t0 >= 5 + 300 + 1800
    # Delivered once: a duplicate of the message does nothing.
    from shared.queues import get_queues
    from shared.steps import Step
    from shared.webhooks.models import DeliveryMessage

    get_queues().send(Step.deliver_webhook, DeliveryMessage(
        org=harness.org, endpoint_id=hook["id"], webhook_id=rx.requests[0]["headers"]["webhook-id"], type="webhook.test",
        body=rx.requests[0]["body"].decode()))
    harness.drain()
    assert len(rx.requests) == 4


def test_after_the_last_retry_the_delivery_is_poisoned_and_five_days_disable_it(
        env: dict[str, str], loopback_ok: None, harness: Harness, rx: Receiver) -> None:
    rx.script = [500] * 7
    hook = add_hook(harness, rx)
    harness.ok("POST", f"/api/org/webhooks/{hook['id']}/test")
    harness.drain()
    assert len(rx.requests) == 7 and len({r["headers"]["webhook-id"] for r in rx.requests}) == 1
    poison = harness.ok("GET", "/api/platform/queues/deliver-webhook/poison", token="admin")
    assert len(poison["items"] if isinstance(poison, dict) else poison) == 1
    view = harness.ok("GET", f"/api/org/webhooks/{hook['id']}")
    assert view["enabled"] and view["failing_since"]  # 17 h 35 min of failures: not yet
    harness.clock.advance(5 * 24 * 3600)
    rx.script = [500]
    harness.ok("POST", f"/api/org/webhooks/{hook['id']}/test")
    harness.drain()
    view = harness.ok("GET", f"/api/org/webhooks/{hook['id']}")
    assert not view["enabled"] and "disabled" in view["notice"]
    # Enabled again by its owner: the failure count starts over.
    view = harness.ok("PATCH", f"/api/org/webhooks/{hook['id']}", json_body={"enabled": True})
    assert view["enabled"] and not view["notice"] and view["failing_since"] is None


def test_private_and_redirecting_urls_are_refused(env: dict[str, str], harness: Harness, rx: Receiver) -> None:
    for url in ("http://example.com/hook", "https://127.0.0.1/hook", "https://10.0.0.8/x",
                "https://169.254.169.254/latest", "https://[::ffff:127.0.0.1]/x", "https://localhost/x"):
        status, body, _ = harness.call("POST", "/api/org/webhooks", json_body={"url": url})
        assert status == 422 and "url" in str(body), (url, body)
    assert harness.ok("GET", "/api/org/webhooks")["items"] == []


def test_a_redirect_is_never_followed(env: dict[str, str], loopback_ok: None, harness: Harness, rx: Receiver) -> None:
    rx.script = [302, 204]
    hook = add_hook(harness, rx)
    harness.ok("POST", f"/api/org/webhooks/{hook['id']}/test")
    harness.drain()
    log = harness.ok("GET", f"/api/org/webhooks/{hook['id']}/deliveries")["items"][::-1]
    assert log[0]["status_code"] == 302 and "redirects are not followed" in log[0]["error"]
    assert len(rx.requests) == 2  # the retry went to the endpoint again, never to the Location


def test_an_address_that_rebinds_to_a_private_one_is_refused_at_delivery(env: dict[str, str], harness: Harness,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.webhooks import send

    answers = {"hooks.example.com": ["93.184.216.34"]}
    monkeypatch.setattr(send, "system_resolver", lambda host, port: answers[host])
    hook = harness.ok("POST", "/api/org/webhooks", json_body={"url": "https://hooks.example.com/x"})
    answers["hooks.example.com"] = ["127.0.0.1"]  # DNS now answers a loopback address
    harness.ok("POST", f"/api/org/webhooks/{hook['id']}/test")
    harness.drain()
    log = harness.ok("GET", f"/api/org/webhooks/{hook['id']}/deliveries")["items"]
    assert log and all("non-public" in x["error"] for x in log), log


def test_rotation_signs_with_both_secrets_for_a_day(env: dict[str, str], loopback_ok: None, harness: Harness,
                                                    rx: Receiver) -> None:
    hook = add_hook(harness, rx)
    old = hook["secret"]
    rotated = harness.ok("POST", f"/api/org/webhooks/{hook['id']}/rotate")
    assert rotated["secret"] != old and rotated["previous_secret_valid_until"]
    harness.ok("POST", f"/api/org/webhooks/{hook['id']}/test")
    harness.drain()
    sent = rx.requests[-1]
    assert len(sent["headers"]["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(sent["body"], sent["headers"])
    Webhook(rotated["secret"]).verify(sent["body"], sent["headers"])
    harness.clock.advance(24 * 3600 + 1)
    harness.ok("POST", f"/api/org/webhooks/{hook['id']}/test")
    harness.drain()
    sent = rx.requests[-1]
    Webhook(rotated["secret"]).verify(sent["body"], sent["headers"])
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(sent["body"], sent["headers"])


def test_owners_only_at_most_ten_and_bad_input_named(env: dict[str, str], loopback_ok: None, harness: Harness,
                                                     rx: Receiver) -> None:
    status, _, _ = harness.call("POST", "/api/org/webhooks", token="member", json_body={"url": rx.url})
    assert status == 403
    status, body, _ = harness.call("POST", "/api/org/webhooks", json_body={"url": rx.url, "types": ["run.exploded"]})
    assert status == 422 and "types" in str(body)
    for _ in range(10):
        add_hook(harness, rx)
    status, body, _ = harness.call("POST", "/api/org/webhooks", json_body={"url": rx.url})
    assert status == 409 and "10" in body["detail"]
    assert harness.call("GET", "/api/org/webhooks/wh-000000000000")[0] == 404
    assert harness.call("GET", "/api/org/webhooks/..%2f")[0] == 404
    # Sealed at rest: the stored row holds no secret in clear.
    from shared.store import get_store

    rows = list(get_store().table("webhooks").query("PartitionKey eq @o", o=harness.org))
    assert rows and all(s not in str(rows) for s in rx.secrets)


def test_a_crash_before_the_send_is_delivered_by_heartbeat_check(env: dict[str, str], loopback_ok: None,
                                                                 harness: Harness, rx: Receiver,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.runs import moves

    add_hook(harness, rx)
    run_id = harness.create_run("memory", "mem-a10")
    monkeypatch.setattr(moves, "drain", lambda ctx, run: run)  # the process dies after the write, before the send
    harness.launch(run_id)
    assert rx.types() == []
    from shared.store import get_store

    run, _ = get_store().runs.get(harness.org, run_id)
    assert [n.type for n in run.notices] == ["run.queued"]
    harness.clock.advance(61)
    harness.tick("heartbeat_check")
    harness.drain()
    assert rx.types() == ["run.queued"]
    assert get_store().runs.get(harness.org, run_id)[0].notices == []


def test_a_failed_connection_check_is_told(env: dict[str, str], loopback_ok: None, cloud: Cloud,
                                           rx: Receiver) -> None:
    h = Harness()
    try:
        add_hook(h, rx, types=["connection.check_failed"])
        from shared.models import Check, CheckStatus
        from tests import fakes

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fakes.MemoryCompute, "validate",
                       lambda self: [Check(name="credentials", status=CheckStatus.fail, message="bad key")])
            assert h.save_compute("memory", {})["status"] == "failed"
        assert rx.types() == ["connection.check_failed"]
        data = rx.events[0]["body"]["data"]
        assert data["failed_checks"] == ["credentials"] and "bad key" not in str(data)
    finally:
        h.close()
