"""Candidates and failover (issue 37) on the in-memory cloud: admission of a run's candidates at create,
the launch step's move to the next candidate on a capacity or quota refusal (and only on those), the
capacity wait, the attempts in the run view, one machine per run under duplicate delivery and crashes
between attempts, nothing left for the sweeper. The per-cloud refusals are in tests/e2e/test_failover_e2e.py."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, cast

import pytest

from shared.context import Context, invocation
from shared.errors import AuthError, CapacityError, QuotaError
from shared.models import GpuOffer
from shared.queues import Queues
from tests.fakes import H100, OFFER, Cloud, MemoryCompute, serve_memory
from tests.harness import Harness, trained_adapter_zip

L40S = GpuOffer(provider="memory", offer_id="mem-l40s", gpu="L40S", gpu_memory_gb=48, machine_type="mem.l40s",
                region="local", compute_per_hour=1.8, disk_per_hour=0.01, total_per_hour=1.81)
A100 = GpuOffer(provider="memory", offer_id="mem-a100", gpu="A100", gpu_memory_gb=80, machine_type="mem.a100",
                region="local", compute_per_hour=2.2, disk_per_hour=0.01, total_per_hour=2.21)


class FourOffers(MemoryCompute):
    def offers(self) -> list[GpuOffer]:
        return [OFFER, L40S, A100, H100]


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """The memory provider for this module: four offers to fail over between."""
    yield from serve_memory(Cloud(), FourOffers)


def _create(harness: Harness, offers: Iterable[str], **fields: Any) -> tuple[int, Any]:
    pid, dsid = harness.project_and_dataset()
    listed = list(offers)
    body = {"project_id": pid, "dataset_version_id": dsid, "base_model": "tensorant/smoke-tiny",
            "price_limit_per_hour": 5.0, "runtime_limit_s": 3600,
            "candidates": [{"connection": "memory", "offer_id": o} for o in listed], **fields}
    status, got, _ = harness.call("POST", "/api/runs", token="member", json_body=body)
    return status, got


def _run(harness: Harness, offers: Iterable[str], **fields: Any) -> str:
    status, got = _create(harness, offers, **fields)
    assert status == 201 or status == 200, got
    return str(got["id"])


def _live(cloud: Cloud) -> list[str]:
    return sorted(f"{m.id}:{m.tags.get('tensorant:attempt', '0')}:{m.state}" for m in cloud.live())


def _swept_nothing(harness: Harness) -> None:
    """The sweeper, past its grace, finds nothing of the run's attempts to release."""
    harness.clock.advance(3 * 3600)
    started = harness.ok("POST", "/api/platform/sweep", token="admin", json_body={"dry_run": True})
    harness.drain()
    found = harness.ok("GET", f"/api/platform/sweeps/{started['sweep_id']}", token="admin")
    assert found["finished"] and found["accounts"] >= 1, found
    assert [f for f in found["findings"] if f.get("action") != "none"] == [], found


@pytest.mark.parametrize("refusal", [CapacityError("InsufficientInstanceCapacity: none left", code="capacity"),
                                     QuotaError("VcpuLimitExceeded: quota", code="VcpuLimitExceeded")])
@pytest.mark.parametrize("after_create", [False, True])
def test_a_refused_candidate_moves_to_the_next_which_trains(harness: Harness, cloud: Cloud, refusal: Exception,
                                                             after_create: bool) -> None:
    cloud.refuse["mem.a10"] = refusal
    cloud.refuse_after_create = after_create  # a failed create that left a machine to release first
    run_id = _run(harness, ["mem-a10", "mem-h100"])
    run = harness.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], harness.step_errors)
    assert [(a["offer_id"], a["outcome"]) for a in run["attempts"]] == [("mem-a10", "refused"),
                                                                         ("mem-h100", "launched")]
    refused = run["attempts"][0]
    assert refused["code"] == refusal.code and refused["message"] and refused["ended_at"]  # type: ignore[attr-defined]
    assert run["offer"]["offer_id"] == "mem-h100" and run["ran_on"]["offer_id"] == "mem-h100"
    assert run["ran_on"]["total_per_hour"] == H100.total_per_hour
    # Only the second attempt's machine exists: the first's (when it made one) was released first.
    live = _live(cloud)
    assert len(live) == 1 and live[0].endswith(":1:running"), live
    typed = [e for e in run["events"] if e["data"].get("type") == "run.attempt_refused"]
    assert len(typed) == 1 and typed[0]["data"]["offer_id"] == "mem-a10"
    harness.agent(run_id).train(trained_adapter_zip())
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded", (run["reason"], harness.step_errors)
    assert not cloud.live()
    _swept_nothing(harness)


def test_a_preflight_no_skips_the_candidate_without_a_create(harness: Harness, cloud: Cloud) -> None:
    """Issue 37.3: the provider's preflight (Azure usages, AWS Service Quotas) says the first candidate cannot
    start: it is skipped with its reason, never asked of the cloud, and the next one launches."""
    cloud.preflight_no["mem-a10"] = "Standard NVADSA10v5 Family vCPUs: 0 of 36 free in eastus"
    run_id = _run(harness, ["mem-a10", "mem-h100"])
    run = harness.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], harness.step_errors)
    assert [(a["offer_id"], a["outcome"], a["code"]) for a in run["attempts"]] == [
        ("mem-a10", "skipped", "preflight"), ("mem-h100", "launched", "")]
    assert "0 of 36 free" in run["attempts"][0]["message"]
    assert cloud.calls.count("launch") == 1  # only the H100 was created
    assert len(cloud.live()) == 1


def test_a_configuration_error_fails_at_once_without_trying_the_next(harness: Harness, cloud: Cloud) -> None:
    cloud.refuse["mem.a10"] = AuthError("the credentials were rejected", code="AuthFailure")
    run_id = _run(harness, ["mem-a10", "mem-h100"])
    run = harness.launch(run_id)
    assert run["state"] == "failed" and "credentials were rejected" in run["reason"]
    assert [(a["offer_id"], a["outcome"]) for a in run["attempts"]] == [("mem-a10", "failed")]
    assert cloud.calls.count("launch") == 1  # the H100 was never asked for
    assert not cloud.live()


def test_every_candidate_refusing_fails_with_a_line_per_attempt(harness: Harness, cloud: Cloud) -> None:
    for t in ("mem.a10", "mem.l40s", "mem.h100"):
        cloud.refuse[t] = CapacityError(f"no {t} now", code="capacity")
    run_id = _run(harness, ["mem-a10", "mem-l40s", "mem-h100"])
    run = harness.launch(run_id)
    assert run["state"] == "failed", run["reason"]
    lines = [line for line in run["reason"].splitlines() if line.startswith("attempt ")]
    assert len(lines) == 3 and all("refused capacity" in line for line in lines), run["reason"]
    assert [a["offer_id"] for a in run["attempts"]] == ["mem-a10", "mem-l40s", "mem-h100"]
    assert not cloud.live()


def test_capacity_wait_tries_the_list_again_until_one_launches(harness: Harness, cloud: Cloud,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cloud.refuse["mem.a10"] = CapacityError("no a10", code="capacity")
    cloud.refuse["mem.h100"] = CapacityError("no h100", code="capacity")
    run_id = _run(harness, ["mem-a10", "mem-h100"], capacity_wait_s=3600)
    calls: list[float] = []
    launch = FourOffers.launch

    def counting(self: FourOffers, spec: Any) -> Any:
        calls.append(harness.clock())
        if len(calls) == 4:  # capacity comes back for the H100 in the second round
            cloud.refuse.pop("mem.h100", None)
        return launch(self, spec)

    monkeypatch.setattr(FourOffers, "launch", counting)
    harness.launch(run_id)
    run = harness.get_run(run_id)
    assert run["state"] == "provisioning", (run["reason"], harness.step_errors)
    outcomes = [(a["offer_id"], a["outcome"]) for a in run["attempts"]]
    assert outcomes == [("mem-a10", "refused"), ("mem-h100", "refused"), ("mem-a10", "refused"),
                        ("mem-h100", "launched")], outcomes
    assert calls[2] - calls[1] >= 60  # the second round waited its backoff (a queue delay, not a sleep)
    assert any("trying them again" in e["message"] for e in run["events"])
    assert len(cloud.live()) == 1


def test_capacity_wait_spent_fails_the_run(harness: Harness, cloud: Cloud) -> None:
    cloud.refuse["mem.a10"] = CapacityError("no a10", code="capacity")
    run_id = _run(harness, ["mem-a10"], capacity_wait_s=600)
    run = harness.launch(run_id)
    assert run["state"] == "failed", run["reason"]
    assert "waited for capacity" in run["reason"] and len(run["attempts"]) >= 3  # rounds at 60, 120, 300 s...
    assert not cloud.live()


def test_duplicate_delivery_keeps_one_machine_and_one_attempt_each(env: dict[str, str], cloud: Cloud) -> None:
    h = Harness(deliver_twice=True)
    try:
        h.save_storage({"kind": "local"})
        assert h.save_compute("memory", {})["status"] == "connected"
        cloud.refuse["mem.a10"] = CapacityError("no a10", code="capacity")
        cloud.refuse_after_create = True
        run_id = _run(h, ["mem-a10", "mem-l40s"])
        run = h.launch(run_id)
        assert [(a["offer_id"], a["outcome"]) for a in run["attempts"]] == [("mem-a10", "refused"),
                                                                             ("mem-l40s", "launched")]
        assert len(cloud.live()) == 1
        h.agent(run_id).train(trained_adapter_zip())
        assert h.get_run(run_id)["state"] == "succeeded"
        assert not cloud.live()
    finally:
        h.close()


class Crash(Exception):
    """The process dies here (the message is delivered again, as after kill -9)."""


@pytest.mark.parametrize("where", ["release", "record", "send"])
def test_a_crash_between_two_attempts_leaves_one_machine_at_most(harness: Harness, cloud: Cloud, where: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.services.steps import launch as launch_step
    from shared.store import get_store

    cloud.refuse["mem.a10"] = CapacityError("no a10", code="capacity")
    cloud.refuse_after_create = True
    run_id = _run(harness, ["mem-a10", "mem-l40s"])
    crashed: list[str] = []
    most: list[int] = []

    def once(name: str) -> None:
        most.append(len([m for m in cloud.live() if m.state != "failed"]))
        if name == where and not crashed:
            crashed.append(name)
            raise Crash(name)

    release = FourOffers.release

    def crashing_release(self: FourOffers, ref: Any, res: Any) -> Any:
        once("release")
        return release(self, ref, res)

    monkeypatch.setattr(FourOffers, "release", crashing_release)
    mutate = get_store().runs.mutate

    def mutate_then(org: str, rid: str, change: Any, **kw: Any) -> Any:
        got = mutate(org, rid, change, **kw)
        if got[1] and got[0].attempts and not got[0].resources:
            once("record")
        return got

    monkeypatch.setattr(get_store().runs, "mutate", mutate_then)
    launch = launch_step.launch

    def launch_losing_a_send(ctx: Context, msg: Any) -> None:
        q = ctx.queues
        real = q.send

        class Q:
            def send(self, step: Any, msg: Any, delay_s: float = 0) -> None:
                if step.value == "launch" and get_store().runs.get(msg.org, msg.run_id)[0].attempts:
                    once("send")  # lost before it was sent: heartbeat-check re-sends it
                real(step, msg, delay_s=delay_s)

            def __getattr__(self, name: str) -> Any:
                return getattr(q, name)

        # The launch step sends through the queues of the context it is handed: these lose that one send.
        launch(Context(ctx.settings, ctx.store, cast(Queues, Q())), msg)

    monkeypatch.setattr(launch_step, "launch", launch_losing_a_send)
    harness.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    harness.drain()
    harness.serve(900)  # heartbeat-check re-sends a lost launch message
    run = harness.get_run(run_id)
    assert crashed == [where], (crashed, harness.step_errors)
    assert run["state"] == "provisioning" and run["resources"], (run["reason"], harness.step_errors)
    assert max(most) <= 1 and len(cloud.live()) == 1, (most, _live(cloud))
    assert [a["outcome"] for a in run["attempts"]][-1] == "launched"
    assert run["ran_on"]["offer_id"] == "mem-l40s"


def test_the_sweeper_releases_an_abandoned_attempts_machine_of_a_live_run(harness: Harness, cloud: Cloud) -> None:
    from shared.clock import now
    from shared.providers.base import RunRef

    cloud.refuse["mem.a10"] = CapacityError("no a10", code="capacity")
    run_id = _run(harness, ["mem-a10", "mem-l40s"])
    run = harness.launch(run_id)
    assert run["ran_on"]["offer_id"] == "mem-l40s"
    # A machine of attempt 0 that the cloud made after all (listed late, a create that answered "no" and
    # still made one): only its marks say whose it is.
    from tests.fakes import Machine

    ref = RunRef("test", harness.org, run_id, attempt=0)
    cloud.machines["i-late"] = Machine(id="i-late", tags=dict(ref.tags), disk_id="vol-late", created_at=now())
    harness.clock.advance(3 * 3600)
    harness.tick("sweeper")
    harness.drain()
    assert "i-late" not in [m.id for m in cloud.live()]
    assert len(cloud.live()) == 1  # the live attempt's machine is its run's, untouched


# ---------------------------------------------------------------- admission


def test_each_candidate_is_checked_and_a_failing_one_is_named(harness: Harness) -> None:
    status, got = _create(harness, ["mem-a10", "mem-nope"])
    assert status == 422 and got["errors"][0]["field"] == "candidates[1]", got
    assert "mem-nope" in got["detail"]
    status, got = _create(harness, ["mem-a10", "mem-h100"], price_limit_per_hour=2.0)  # the H100 is 3.01/h
    assert status == 422 and got["errors"][0]["field"] == "candidates[1]" and "above" in got["detail"], got
    status, got = _create(harness, ["mem-a10", "mem-a10"])
    assert status == 422 and "twice" in got["detail"], got
    status, got = _create(harness, ["mem-a10"], capacity_wait_s=10 * 24 * 3600)
    assert status == 422 and got["errors"][0]["field"] == "capacity_wait_s", got
    status, got = _create(harness, ["mem-a10", "mem-h100"], candidates=[{"connection": "aws/x", "offer_id": "y"}] * 9)
    assert status == 422, got


def test_fallback_fitting_fills_by_forecast_cost_under_the_price_limit(harness: Harness) -> None:
    status, got = _create(harness, ["mem-l40s"], fallback="fitting", price_limit_per_hour=2.5)
    assert status in (200, 201), got
    listed = [c["offer_id"] for c in got["candidates"]]
    assert listed[0] == "mem-l40s"  # the one asked for first
    assert "mem-h100" not in listed  # above the price limit
    assert set(listed) == {"mem-l40s", "mem-a10", "mem-a100"}
    # The dearest candidate's price is the run's estimate, and its forecast the costliest.
    assert got["estimate_per_hour"] == A100.total_per_hour
    costs = {c["offer_id"]: c["total_per_hour"] for c in got["candidates"]}
    assert costs["mem-a100"] == max(costs.values())
    # The ones added are ordered by forecast cost (price x forecast time), then price.
    from adapter_format.base_models import BASE_MODELS
    from shared.models import TrainingSettings
    from shared.runs import forecast
    from shared.store import get_store

    dataset = get_store().datasets.get(harness.org, got["dataset_version_id"])
    training = TrainingSettings.model_validate(got["training"])
    by_id = {o.offer_id: o for o in (OFFER, A100)}
    predicted = {i: forecast.predict(dataset, training, BASE_MODELS["tensorant/smoke-tiny"], by_id[i]).cost
                 for i in listed[1:]}
    assert listed[1:] == sorted(listed[1:], key=lambda i: (predicted[i], by_id[i].total_per_hour)), predicted


def test_provider_and_offer_may_be_left_to_the_first_candidate(harness: Harness) -> None:
    status, got = _create(harness, ["mem-h100", "mem-a10"])
    assert status in (200, 201), got
    assert got["provider"] == "memory" and got["offer"]["offer_id"] == "mem-h100"
    assert [c["offer_id"] for c in got["candidates"]] == ["mem-h100", "mem-a10"]
    assert got["attempts"] == [] and got["ran_on"] is None


def test_a_runpod_volume_pins_runpod_candidates_to_its_datacenter(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import SecretStr

    from shared.org_storage.config import RunPodVolumeConfig
    from shared.runs import admission

    volume = RunPodVolumeConfig(volume_id="vol0abc123", datacenter_id="EU-RO-1", access_key_id="user_x",
                                secret_access_key=SecretStr("rps_x"))
    monkeypatch.setattr(admission, "storage_config", lambda ctx, org: volume)
    ctx = invocation()
    there = GpuOffer(provider="runpod", offer_id="runpod-secure-eu-ro-1-a40", gpu="A40", gpu_memory_gb=48,
                     machine_type="NVIDIA A40", region="EU-RO-1", compute_per_hour=0.4, disk_per_hour=0.0,
                     total_per_hour=0.4)
    elsewhere = there.model_copy(update={"offer_id": "runpod-secure-us-ks-2-a40", "region": "US-KS-2"})
    assert admission.unreachable_storage(ctx, "org-a", there) is None
    why = admission.unreachable_storage(ctx, "org-a", elsewhere)
    assert why is not None and "EU-RO-1" in why and "US-KS-2" in why
    assert admission.unreachable_storage(ctx, "org-a", OFFER) is None  # another provider reaches it over its S3 API


def test_a_drafts_candidates_can_be_edited_and_launch_rechecks_every_price(harness: Harness, cloud: Cloud,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _run(harness, ["mem-a10"])
    edited = harness.ok("PATCH", f"/api/runs/{run_id}", token="member",
                  json_body={"candidates": [{"connection": "memory", "offer_id": "mem-l40s"},
                                            {"connection": "memory", "offer_id": "mem-h100"}]})
    assert [c["offer_id"] for c in edited["candidates"]] == ["mem-l40s", "mem-h100"]
    assert edited["offer"]["offer_id"] == "mem-l40s" and edited["estimate_per_hour"] == H100.total_per_hour
    # The H100's price rose above the limit after the draft: the launch names it and rents nothing.
    dear = H100.model_copy(update={"total_per_hour": 9.0, "compute_per_hour": 8.99})
    monkeypatch.setattr(FourOffers, "offers", lambda self: [OFFER, L40S, A100, dear])
    harness.ok("POST", "/api/connections/compute/memory/check")
    harness.drain()
    status, got, _ = harness.call("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    assert status == 409 and "candidate 2" in got["detail"] and "mem-h100" in got["detail"], got
    assert harness.get_run(run_id)["state"] == "draft" and not cloud.live()


def test_a_named_connection_not_saved_is_refused_by_name(harness: Harness) -> None:
    status, got = _create(harness, ["mem-a10"], candidates=[{"connection": "memory", "offer_id": "mem-a10"},
                                                      {"connection": "memory/us-west-2", "offer_id": "mem-l40s"}])
    assert status == 422 and got["errors"][0]["field"] == "candidates[1]", got
    assert "memory/us-west-2" in got["detail"]
    status, got = _create(harness, ["mem-a10"], candidates=[{"connection": "nope", "offer_id": "mem-a10"}])
    assert status == 422 and "unknown provider" in got["detail"], got


def test_a_capacity_wait_moves_the_boot_deadline_past_it(harness: Harness, cloud: Cloud) -> None:
    """Heartbeat-check does not end a run that waits for capacity at the boot deadline it had at launch
    (TENSORANT_PROVISIONING_TIMEOUT_S, 900 s): the wait's round moves it past the wait (nothing bills meanwhile)."""
    from shared.settings import get_settings

    cloud.refuse["mem.a10"] = CapacityError("no a10", code="capacity")
    run_id = _run(harness, ["mem-a10"], capacity_wait_s=3 * 3600)
    held: list[float] = []
    send = harness._send

    def hold_delayed(queue: Any, body: Any, delay_s: float = 0) -> None:
        if delay_s >= 60:  # the round's next try, waiting in the queue: held here, never delivered
            held.append(delay_s)
            return
        send(queue, body, delay_s)

    harness._send = hold_delayed  # type: ignore[method-assign]
    harness.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
    harness.drain()
    assert held == [60.0]
    run = harness.get_run(run_id)
    assert run["state"] == "provisioning" and [a["outcome"] for a in run["attempts"]] == ["refused"]
    timeout = get_settings().provisioning_timeout_s
    # Served minute by minute past the launch's boot deadline: heartbeat-check re-sends the held try (a lost
    # message, as it should), each round refuses and waits again, and the run is never ended for its boot.
    harness.serve(timeout + 300)
    run = harness.get_run(run_id)
    assert run["state"] == "provisioning", (run["reason"], harness.step_errors)
    assert len(run["attempts"]) >= 2 and all(a["outcome"] == "refused" for a in run["attempts"])
