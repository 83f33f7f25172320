"""Failover end to end (issue 37) through the real function handlers, each cloud refusing as it does:
EC2 behind a proxy that answers RunInstances with EC2's own error (moto never runs out of capacity), Azure
on the fake ARM server answering with ARM's error bodies, RunPod on the fake GraphQL server answering
"no longer any instances available", and the local provider training for real after a refusal. Each
test: the first candidate refuses, the next one trains to succeeded, and nothing is left billing (the
clouds list nothing of the run, the sweeper finds nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import Harness, trained_adapter_zip
from tests.providers.aws.refusing_proxy import Refusal, RefusingProxy
from tests.providers.aws.rig import Rig
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.runpod.fake_server import FakeRunPod

pytestmark = pytest.mark.e2e

RUNPOD_KEY = "rpa_FAILOVERKEY0123456789"


@pytest.fixture
def proxy(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> Iterator[RefusingProxy]:
    """EC2 (moto) behind the refusing proxy: the AWS provider's every request goes through it."""
    fake = RefusingProxy(rig.url).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", fake.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", rig.pricing.url)
    yield fake
    fake.stop()


@pytest.fixture
def runpod(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunPod]:
    from shared.settings import reset_settings

    fake = FakeRunPod(api_key=RUNPOD_KEY).start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)
    reset_settings()
    yield fake
    fake.stop()


def _harness(**connections: dict[str, Any]) -> Harness:
    h = Harness()
    assert h.save_storage({"kind": "local"})["status"] == "connected"
    for provider, body in connections.items():
        conn = h.save_compute(provider, body)
        assert conn["status"] == "connected", (provider, conn["checks"])
    return h


@pytest.fixture
def aws_h(env: dict[str, str], rig: Rig, proxy: RefusingProxy) -> Iterator[Harness]:
    h = _harness(aws=rig.body(workspace_disk_gb=50))
    yield h
    h.close()


def _offers(harness: Harness, provider: str) -> dict[str, dict[str, Any]]:
    return {o["machine_type"]: o for o in harness.ok("GET", "/api/catalog/gpus", params={"provider": provider})["items"]}


def _run(harness: Harness, candidates: list[tuple[str, str]], **fields: Any) -> str:
    pid, dsid = harness.project_and_dataset()
    run = harness.ok("POST", "/api/runs", token="member", json_body={
        "project_id": pid, "dataset_version_id": dsid, "base_model": "tensorant/smoke-tiny",
        "price_limit_per_hour": 100.0, "runtime_limit_s": 3600,
        "candidates": [{"connection": c, "offer_id": o} for c, o in candidates], **fields})
    assert len(run["candidates"]) == len(candidates)
    return str(run["id"])


def _trains_to_succeeded(harness: Harness, run_id: str) -> dict[str, Any]:
    run = harness.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], harness.step_errors)
    harness.agent(run_id).train(trained_adapter_zip())
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded", (run["reason"], run["release_error"], harness.step_errors)
    return dict(run)


def _sweeper_finds_nothing(harness: Harness) -> None:
    harness.clock.advance(3 * 3600)  # past the sweeper's grace
    started = harness.ok("POST", "/api/platform/sweep", token="admin", json_body={"dry_run": True})
    harness.drain()
    report = harness.ok("GET", f"/api/platform/sweeps/{started['sweep_id']}", token="admin")
    assert report["finished"] and report["accounts"] >= 1, report
    assert [f for f in report["findings"] if f.get("action") != "none"] == [], report


def _live_instances(rig: Rig) -> list[dict[str, Any]]:
    return [i for r in rig.ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] not in ("terminated", "shutting-down")]


def _attempts(run: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(a["provider"], a["outcome"], a["code"]) for a in run["attempts"]]


# ---------------------------------------------------------------- AWS (moto behind the refusing proxy)


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "InsufficientHostCapacity", "VcpuLimitExceeded",
                                  "InstanceLimitExceeded"])
def test_aws_refusal_fails_over_to_the_next_offer_which_trains(aws_h: Harness, rig: Rig, proxy: RefusingProxy,
                                                               code: str) -> None:
    offers = _offers(aws_h, "aws")
    first, second = offers["g6.xlarge"], next(o for t, o in offers.items() if t != "g6.xlarge")
    proxy.refuse["g6.xlarge"] = Refusal(code)
    run_id = _run(aws_h, [("aws", first["offer_id"]), ("aws", second["offer_id"])])
    run = _trains_to_succeeded(aws_h, run_id)
    assert _attempts(run) == [("aws", "refused", code), ("aws", "launched", "")]
    assert proxy.refused == [("g6.xlarge", code)]
    assert run["ran_on"]["offer_id"] == second["offer_id"] and run["offer"]["machine_type"] == second["machine_type"]
    # The machine that ran is marked as the run's second attempt.
    [instance] = [i for r in rig.ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags["tensorant:attempt"] == "1" and tags["tensorant:run"] == run_id
    assert _live_instances(rig) == []
    _sweeper_finds_nothing(aws_h)


def test_aws_instance_a_refused_create_left_is_terminated_before_the_next(aws_h: Harness, rig: Rig,
                                                                          proxy: RefusingProxy) -> None:
    """EC2 made an instance and still answered InsufficientInstanceCapacity: it is terminated (confirmed)
    before the next candidate's create, so the run never holds two."""
    offers = _offers(aws_h, "aws")
    first, second = offers["g6.xlarge"], next(o for t, o in offers.items() if t != "g6.xlarge")
    proxy.refuse["g6.xlarge"] = Refusal("InsufficientInstanceCapacity", after_create=True)
    run_id = _run(aws_h, [("aws", first["offer_id"]), ("aws", second["offer_id"])])
    run = aws_h.launch(run_id)
    assert _attempts(run) == [("aws", "refused", "InsufficientInstanceCapacity"), ("aws", "launched", "")]
    every = [i for r in rig.ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    states = sorted((i["InstanceType"], i["State"]["Name"]) for i in every)
    assert len(every) == 2 and ("g6.xlarge", "terminated") in states, states
    assert [i["InstanceType"] for i in _live_instances(rig)] == [second["machine_type"]]
    aws_h.agent(run_id).train(trained_adapter_zip())
    assert aws_h.get_run(run_id)["state"] == "succeeded"
    assert _live_instances(rig) == []
    _sweeper_finds_nothing(aws_h)


def test_aws_configuration_error_fails_at_once_without_the_next(aws_h: Harness, rig: Rig,
                                                                proxy: RefusingProxy) -> None:
    offers = _offers(aws_h, "aws")
    first, second = offers["g6.xlarge"], next(o for t, o in offers.items() if t != "g6.xlarge")
    proxy.refuse["g6.xlarge"] = Refusal("AuthFailure")
    run_id = _run(aws_h, [("aws", first["offer_id"]), ("aws", second["offer_id"])])
    run = aws_h.launch(run_id)
    assert run["state"] == "failed", run["reason"]
    assert _attempts(run) == [("aws", "failed", "AuthFailure")]
    assert proxy.refused == [("g6.xlarge", "AuthFailure")]
    assert rig.ec2.describe_instances()["Reservations"] == []  # the second offer was never asked for


# ---------------------------------------------------------------- Azure (the fake ARM server)


@pytest.mark.parametrize("code", ["AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
                                  "SkuNotAvailable", "QuotaExceeded"])
def test_azure_refusal_releases_what_it_left_and_fails_over(azure_h: Harness, arm: FakeArm, code: str) -> None:
    offers = _offers(azure_h, "azure")
    first, second = offers["Standard_NC24ads_A100_v4"], offers["Standard_NC40ads_H100_v5"]
    arm.refuse_sizes[first["machine_type"]] = code
    # The rig's subscription has no H100 quota (the check's warning case); here it has some, or the launch's
    # preflight (compute usages) would skip the H100 before asking for it.
    for usage in arm.usages:
        if usage["name"]["value"] == "standardNCadsH100v5Family":
            usage["limit"] = 80
    run_id = _run(azure_h, [("azure", first["offer_id"]), ("azure", second["offer_id"])])
    run = _trains_to_succeeded(azure_h, run_id)
    expected = "OperationNotAllowed" if code == "QuotaExceeded" else code
    assert _attempts(run) == [("azure", "refused", expected), ("azure", "launched", "")]
    assert run["ran_on"]["offer_id"] == second["offer_id"]
    # The failed create's VM, OS disk and NIC (an allocation failure leaves them) were released, and the second
    # attempt's are gone with the run.
    for kind in ("Microsoft.Compute/virtualMachines", "Microsoft.Compute/disks", "Microsoft.Network/networkInterfaces"):
        assert arm.of_type(kind) == [], (kind, [r["name"] for r in arm.of_type(kind)])
    _sweeper_finds_nothing(azure_h)


# ---------------------------------------------------------------- RunPod (the fake GraphQL server)


def test_runpod_out_of_stock_fails_over_to_the_next_gpu(env: dict[str, str], runpod: FakeRunPod) -> None:
    h = _harness(runpod={"api_key": RUNPOD_KEY})
    try:
        offers = _offers(h, "runpod")
        first, second = offers["NVIDIA A40"], offers["NVIDIA GeForce RTX 4090"]
        runpod.sold_out.add("NVIDIA A40")
        run_id = _run(h, [("runpod", first["offer_id"]), ("runpod", second["offer_id"])])
        run = _trains_to_succeeded(h, run_id)
        assert _attempts(run) == [("runpod", "refused", "capacity"), ("runpod", "launched", "")]
        assert "There are no longer any instances available" in run["attempts"][0]["message"]
        [create1, create2] = runpod.creates()
        assert create1["variables"]["input"]["gpuTypeId"] == "NVIDIA A40"
        assert create2["variables"]["input"]["name"].split("--")[0].endswith("-try1")  # the attempt in its name
        assert runpod.pods == {}
        _sweeper_finds_nothing(h)
    finally:
        h.close()


# ---------------------------------------------------------------- across providers


def test_aws_capacity_then_azure_quota_then_runpod_trains(env: dict[str, str], rig: Rig, proxy: RefusingProxy,
                                                          arm: FakeArm, runpod: FakeRunPod) -> None:
    from tests.providers.azure.rig import config_body

    h = _harness(aws=rig.body(workspace_disk_gb=50), azure=config_body(), runpod={"api_key": RUNPOD_KEY})
    try:
        aws, azure, rp = _offers(h, "aws")["g6.xlarge"], _offers(h, "azure")["Standard_NC24ads_A100_v4"], \
            _offers(h, "runpod")["NVIDIA A40"]
        proxy.refuse["g6.xlarge"] = Refusal("InsufficientInstanceCapacity")
        arm.refuse_sizes["Standard_NC24ads_A100_v4"] = "QuotaExceeded"
        run_id = _run(h, [("aws", aws["offer_id"]), ("azure", azure["offer_id"]), ("runpod", rp["offer_id"])])
        run = _trains_to_succeeded(h, run_id)
        assert _attempts(run) == [("aws", "refused", "InsufficientInstanceCapacity"),
                                  ("azure", "refused", "OperationNotAllowed"), ("runpod", "launched", "")]
        assert run["provider"] == "runpod" and run["ran_on"]["provider"] == "runpod"
        assert run["final_cost"] is not None and run["offer"]["total_per_hour"] == rp["total_per_hour"]
        refused = [e for e in run["events"] if e["data"].get("type") == "run.attempt_refused"]
        assert sorted(e["data"]["provider"] for e in refused) == ["aws", "azure"]
        assert _live_instances(rig) == [] and runpod.pods == {}
        assert arm.of_type("Microsoft.Compute/virtualMachines") == []
        assert arm.of_type("Microsoft.Network/networkInterfaces") == []
        _sweeper_finds_nothing(h)
    finally:
        h.close()


# ---------------------------------------------------------------- local (over HTTP, the real agent and trainer)


def test_local_trains_after_the_first_candidate_refused(rig: Rig, proxy: RefusingProxy, api: Any) -> None:
    """The dev host serving the app: EC2 refuses the first candidate, the local provider's agent process
    trains the second to succeeded, and nothing of either is left."""
    from tests.e2e.local_host import TERMINAL_OR_RETAINED
    from tests.e2e.test_local_e2e import setup_org

    project, dataset = setup_org(api)
    api("PUT", "/api/connections/compute/aws", json=rig.body(workspace_disk_gb=50))
    conn = api.wait("/api/connections/compute/aws", lambda c: c["status"] != "checking", 60)
    assert conn["status"] == "connected", conn
    aws = next(o for o in api("GET", "/api/catalog/gpus?provider=aws")["items"] if o["machine_type"] == "g6.xlarge")
    local = api("GET", "/api/catalog/gpus?provider=local")["items"][0]
    proxy.refuse["g6.xlarge"] = Refusal("InsufficientInstanceCapacity")
    run = api("POST", "/api/runs", json={
        "project_id": project, "dataset_version_id": dataset, "base_model": "tensorant/smoke-tiny",
        "price_limit_per_hour": 10.0, "candidates": [{"connection": "aws", "offer_id": aws["offer_id"]},
                                                     {"connection": "local", "offer_id": local["offer_id"]}]})
    api("POST", f"/api/runs/{run['id']}/launch", json={"confirm": True})
    run = api.wait(f"/api/runs/{run['id']}", lambda r: r["state"] in TERMINAL_OR_RETAINED, 120)
    assert run["state"] == "succeeded", run["reason"]
    assert _attempts(run) == [("aws", "refused", "InsufficientInstanceCapacity"), ("local", "launched", "")]
    assert run["ran_on"]["provider"] == "local" and len(run["adapter_sha256"]) == 64
    assert _live_instances(rig) == []
