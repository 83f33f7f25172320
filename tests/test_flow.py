"""Run flows through the real function handlers and Azurite, on the in-memory provider."""

from __future__ import annotations

from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip


def states(harness: Harness, run_id: str) -> list[str]:
    return [e["message"] for e in harness.get_run(run_id)["events"] if e["kind"] == "transition"]


def test_trial_succeeds_and_machine_is_released(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    run = harness.launch(run_id)
    assert run["state"] == "provisioning"
    assert [r["kind"] for r in run["resources"]] == ["instance", "volume"]
    harness.agent(run_id).train(smoke_adapter_zip())
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded", run["reason"]
    assert not cloud.live()
    walked = " ".join(states(harness, run_id))
    for a, b in [("draft", "queued"), ("queued", "provisioning"), ("provisioning", "preparing"),
                 ("preparing", "training"), ("training", "exporting"), ("exporting", "verifying"),
                 ("verifying", "releasing"), ("releasing", "succeeded")]:
        assert f"{a} -> {b}" in walked
    logs = harness.ok("GET", f"/api/runs/{run_id}/logs")["lines"]
    assert "training 0.5" in logs


def test_every_message_delivered_twice_gives_the_same_end(harness: Harness, cloud: Cloud) -> None:
    harness.deliver_twice = True
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    assert len(cloud.machines) == 1
    harness.agent(run_id).train(smoke_adapter_zip())
    assert harness.get_run(run_id)["state"] == "succeeded"
    assert len(cloud.machines) == 1 and not cloud.live()
    assert not harness.step_errors


def test_trainer_failure_retains_then_upload_recovers(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    a = harness.agent(run_id)
    a.heartbeat("training", 0.3)
    a.complete_failed("CUDA out of memory", exit_code=137)
    run = harness.get_run(run_id)
    assert run["state"] == "retained"
    assert "exit code 137" in run["reason"]
    assert "still bills" in run["billing_note"]
    [m] = cloud.machines.values()
    assert m.state == "stopped" and m.disk_exists
    bad = harness.recover(run_id, upload=b"PK not really a zip")
    assert bad["state"] == "retained" and "verification failed" in bad["reason"]
    run = harness.recover(run_id, upload=smoke_adapter_zip())
    assert run["state"] == "succeeded", run["reason"]
    assert not cloud.live()


def test_bad_adapter_retains_with_reason(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).train(smoke_adapter_zip(base_model="meta-llama/Llama-3.2-1B"))
    run = harness.get_run(run_id)
    assert run["state"] == "retained"
    assert "base model" in run["reason"]


def test_timeout_retains_and_saved_adapter_recovers(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    a = harness.agent(run_id)
    a.heartbeat("training", 0.9)
    a.upload(smoke_adapter_zip())
    run = harness.expire(run_id)
    assert run["state"] == "retained", run
    assert "runtime limit" in run["reason"]
    run = harness.recover(run_id)
    assert run["state"] == "succeeded", run["reason"]


def test_launch_capacity_error_fails_run_and_leaves_nothing(harness: Harness, cloud: Cloud) -> None:
    from shared.errors import CapacityError

    cloud.launch_error = CapacityError("no A10 capacity in this zone now; try another zone or later")
    run_id = harness.create_run("memory", "mem-a10")
    run = harness.launch(run_id)
    assert run["state"] == "failed"
    assert "no A10 capacity" in run["reason"]
    assert not cloud.live()


def test_cancel_discard_releases(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": True})
    harness.drain()
    assert harness.get_run(run_id)["state"] == "cancelled"
    assert not cloud.live()


def test_launch_refused_above_price_limit_and_without_confirm(harness: Harness) -> None:
    run_id = harness.create_run("memory", "mem-a10", price_limit=0.5)
    status, body, headers = harness.call("POST", f"/api/runs/{run_id}/launch", json_body={"confirm": True})
    assert status == 409 and "limit" in body["detail"]
    assert headers["Content-Type"] == "application/problem+json"
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/launch", json_body={"confirm": False})
    assert status == 422 and body["errors"][0]["field"] == "confirm"
    assert harness.get_run(run_id)["state"] == "draft"


def test_launch_of_a_launched_run_is_409_nothing_launched(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/launch", json_body={"confirm": True})
    assert status == 409
    assert body["detail"].startswith("nothing was launched: the run is provisioning")
    assert len(cloud.machines) == 1


def test_machine_created_after_its_run_was_cancelled_is_released_at_once(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")

    def cancel_and_finish_release() -> None:
        cloud.before_create = None
        harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": True})
        harness.drain()  # the release finds nothing yet and confirms: the run is cancelled
        assert harness.get_run(run_id)["state"] == "cancelled"

    cloud.before_create = cancel_and_finish_release
    harness.launch(run_id)
    assert len(cloud.machines) == 1
    assert not cloud.live()  # released by the launch step itself, not left for the sweeper
    events = [e["message"] for e in harness.get_run(run_id)["events"]]
    assert any("created after the run ended: released" in m for m in events)


def test_throttled_launch_is_retried_after_its_delay_and_succeeds(harness: Harness, cloud: Cloud) -> None:
    from shared.errors import ThrottledError

    calls: list[float] = []

    def throttle_once() -> None:
        calls.append(harness.clock.t)
        if len(calls) == 1:
            raise ThrottledError("RequestLimitExceeded: slow down", retry_after_s=20)

    cloud.before_create = throttle_once
    run_id = harness.create_run("memory", "mem-a10")
    run = harness.launch(run_id)
    assert run["state"] == "provisioning" and len(cloud.machines) == 1
    # The retry waited for the cloud's delay and the launch claim's settle time, no less.
    assert calls[1] - calls[0] >= 20
    assert any("launch will be retried" in e["message"] for e in run["events"])
