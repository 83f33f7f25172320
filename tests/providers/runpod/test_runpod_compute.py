"""RunPodCompute against the fake RunPod GraphQL server on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from shared import clock
from shared.errors import AuthError, CapacityError, PermanentError, RetryableError
from shared.models import CheckStatus, CloudResource, MachineState
from shared.providers.base import RunRef
from shared.providers.runpod.compute import RunPodCompute, is_supported_gpu
from shared.providers.runpod.config import RunPodConfig
from shared.settings import Settings
from tests.providers.runpod.fake_server import FakeRunPod
from tests.providers.runpod.rig import KEY, REF, provider, spec
from tests.support.clock import FakeClock
from tests.support.pods import from_pod_env


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    c = FakeClock()
    clock.set_clock(c)
    yield c
    clock.set_clock(None)


def volume_provider(key: str = KEY) -> RunPodCompute:
    return provider(key, network_volume_id="vol0abc123", datacenter_id="EU-RO-1")


# ---------------------------------------------------------------- validate


def test_validate_ok_says_write_permissions_unproven(fake: FakeRunPod) -> None:
    checks = provider().validate()
    by_name = {c.name: c for c in checks}
    assert by_name["api key"].status == CheckStatus.ok
    assert by_name["list pods"].status == CheckStatus.ok
    assert by_name["write permissions"].status == CheckStatus.warn
    assert "cannot prove write permissions" in by_name["write permissions"].message
    assert "creates nothing" in by_name["write permissions"].message
    assert not any(op in fake.ops() for op in ("podFindAndDeployOnDemand", "podStop", "podTerminate"))


def test_validate_bad_key_fails_with_hint(fake: FakeRunPod) -> None:
    checks = provider("rpa_WRONGKEY999999").validate()
    assert [c.status for c in checks] == [CheckStatus.fail]
    assert "Replace the key" in checks[0].message


def test_validate_s3_key_pasted_as_compute_key(fake: FakeRunPod) -> None:
    checks = provider("rps_abcdefghijklmnop").validate()
    assert checks[0].status == CheckStatus.fail
    assert "S3 API key" in checks[0].message and "not interchangeable" in checks[0].message
    assert fake.requests == []  # refused before sending the S3 secret to the compute API


def test_validate_network_volume(fake: FakeRunPod) -> None:
    ok = {c.name: c for c in volume_provider().validate()}
    assert ok["network volume"].status == CheckStatus.ok
    wrong_dc = provider(network_volume_id="vol0abc123", datacenter_id="EUR-IS-1").validate()
    assert {c.name: c for c in wrong_dc}["network volume"].status == CheckStatus.fail
    missing = provider(network_volume_id="volzzz999", datacenter_id="EU-RO-1").validate()
    assert "not in this RunPod account" in {c.name: c for c in missing}["network volume"].message


def test_config_rejects_volume_without_datacenter_and_community_with_volume() -> None:
    with pytest.raises(ValueError):
        RunPodConfig(api_key=SecretStr(KEY), network_volume_id="vol0abc123")
    with pytest.raises(ValueError):
        RunPodConfig(api_key=SecretStr(KEY), network_volume_id="vol0abc123", datacenter_id="EU-RO-1",
                     cloud_type="COMMUNITY")


# ---------------------------------------------------------------- offers


def test_offers_ampere_or_newer_only(fake: FakeRunPod) -> None:
    offers = provider().offers()
    types = {o.machine_type for o in offers}
    assert types == {"NVIDIA A40", "NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3", "NVIDIA L4"}
    a40 = next(o for o in offers if o.machine_type == "NVIDIA A40")
    assert a40.gpu_memory_gb == 48 and a40.compute_per_hour == 0.40 and a40.gpu_count == 1
    assert a40.total_per_hour == pytest.approx(a40.compute_per_hour + a40.disk_per_hour)
    assert a40.disk_per_hour > 0 and "T4" in a40.note


def test_offers_with_network_volume_only_in_its_datacenter(fake: FakeRunPod) -> None:
    offers = provider(network_volume_id="vol0abc123", datacenter_id="EUR-IS-1").offers()
    assert {o.machine_type for o in offers} == {"NVIDIA A40", "NVIDIA L4"}
    assert all(o.region == "EUR-IS-1" and "billed separately" in o.note for o in offers)


def test_a_host_with_a_newer_cuda_13_is_offered_and_rented(fake: FakeRunPod) -> None:
    """A GPU whose hosts report CUDA 13.1 is in the catalog, and the pod create accepts those hosts
    (tests/providers/runpod/test_cuda_and_stock.py: the CUDA minimum, stock without a volume)."""
    next(g for g in fake.gpus if g["id"] == "NVIDIA A40")["cuda"] = "13.1"
    offers = provider(network_volume_id="vol0abc123", datacenter_id="EU-RO-1").offers()
    assert "NVIDIA A40" in {o.machine_type for o in offers}
    (pod,) = volume_provider().launch(spec())
    assert pod.kind == "pod" and len(fake.pods) == 1
    assert fake.creates()[0]["variables"]["input"]["minCudaVersion"] == "13.0"


def test_a_gpu_whose_hosts_are_below_cuda_13_is_not_offered(fake: FakeRunPod) -> None:
    """The catalog asks RunPod's price and stock for the same CUDA minimum the pod create sends: a GPU
    whose hosts report only CUDA 12.8 is out of the volume datacenter's catalog, and a launch on it
    anyway gets RunPod's capacity answer."""
    next(g for g in fake.gpus if g["id"] == "NVIDIA A40")["cuda"] = "12.8"
    offers = provider(network_volume_id="vol0abc123", datacenter_id="EU-RO-1").offers()
    assert "NVIDIA A40" not in {o.machine_type for o in offers}
    assert "NVIDIA GeForce RTX 4090" in {o.machine_type for o in offers}
    with pytest.raises(CapacityError):
        volume_provider().launch(spec())
    assert fake.pods == {}


def test_gpu_allow_list() -> None:
    for ok in ("NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB", "NVIDIA RTX A6000", "NVIDIA A10G", "NVIDIA L40S",
               "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 5090", "NVIDIA H200", "NVIDIA B200",
               "NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX PRO 6000 Blackwell Server Edition"):
        assert is_supported_gpu(ok), ok
    for ok in ("NVIDIA GeForce RTX 3060", "NVIDIA GeForce RTX 4070 Ti", "NVIDIA RTX 4000 Ada Generation",
               "NVIDIA RTX 5000 Ada Generation", "NVIDIA RTX A4000"):
        assert is_supported_gpu(ok), ok
    for bad in ("Tesla T4", "Tesla V100-PCIE-16GB", "Tesla P100", "NVIDIA GeForce RTX 2080 Ti", "NVIDIA TITAN RTX",
                "Quadro RTX 6000", "AMD Instinct MI300X OAM", "NVIDIA GeForce GTX 1080 Ti",
                "Quadro RTX 4000", "Quadro RTX 5000", "NVIDIA RTX 3000"):  # Turing workstation cards
        assert not is_supported_gpu(bad), bad


# ---------------------------------------------------------------- launch


def test_launch_creates_one_pod_and_is_idempotent(fake: FakeRunPod) -> None:
    p = provider()
    first = p.launch(spec())
    second = p.launch(spec())
    assert len(fake.creates()) == 1
    assert [r.id for r in first] == [r.id for r in second]
    res = first[0]
    assert res.kind == "pod" and res.name == "tensorant-test-run-abc--org1" and res.run_id == "run-abc"
    inp = fake.creates()[0]["variables"]["input"]
    assert inp["gpuCount"] == 1 and inp["gpuTypeId"] == "NVIDIA A40"
    assert inp["imageName"] == "ghcr.io/tensorant/trainer:2026.11"
    assert inp["ports"] == "" and inp["supportPublicIp"] is False
    assert inp["minCudaVersion"] == "13.0" and "allowedCudaVersions" not in inp
    assert "networkVolumeId" not in inp and inp["volumeInGb"] >= 10 and inp["volumeMountPath"] == "/workspace"
    env = from_pod_env(inp["env"])
    assert env["TENSORANT_DATA_DIR"] == "/workspace/data" and env["TENSORANT_RUN_ID"] == "run-abc"


def test_launch_with_network_volume_pins_datacenter(fake: FakeRunPod) -> None:
    volume_provider().launch(spec())
    inp = fake.creates()[0]["variables"]["input"]
    assert inp["networkVolumeId"] == "vol0abc123" and inp["dataCenterId"] == "EU-RO-1"
    assert inp["cloudType"] == "SECURE"


def test_env_value_cannot_change_the_request(fake: FakeRunPod) -> None:
    nasty = 'a"b\\" }, gpuCount: 8, env: [{ key: "X", value: "y" }] }) { id } }\n# {"x": 1}\r\n\'end'
    provider().launch(spec(env={"TENSORANT_NOTE": nasty, "TENSORANT_RUN_ID": "run-abc"}))
    req = fake.creates()[0]
    inp = req["variables"]["input"]
    env = from_pod_env(inp["env"])
    assert env["TENSORANT_NOTE"] == nasty  # arrived intact
    assert set(env) == {"TENSORANT_NOTE", "TENSORANT_RUN_ID", "TENSORANT_DATA_DIR", "TENSORANT_POWEROFF"}
    assert inp["gpuCount"] == 1 and inp["name"] == "tensorant-test-run-abc--org1"
    assert "gpuCount: 8" not in req["query"] and nasty not in req["query"]  # the value never enters the query text
    raw = next(r["raw"] for r in fake.requests if b"podFindAndDeployOnDemand" in r["raw"])
    assert json.loads(raw)["variables"]["input"]["env"] == inp["env"]
    stored = next(iter(fake.pods.values()))
    assert from_pod_env(stored["env"])["TENSORANT_NOTE"] == nasty


def test_runpod_package_formatting_would_be_injectable() -> None:
    """Why create does not use the package: its formatted mutation lets a value rewrite the input."""
    from runpod.api.mutations.pods import generate_pod_deployment_mutation

    query = generate_pod_deployment_mutation("n", "img", gpu_type_id="g", gpu_count=1,
                                             env={"K": 'v" }, { key: "EVIL", value: "1'})
    assert 'key: "EVIL"' in query


def test_capacity_error_has_actionable_reason(fake: FakeRunPod) -> None:
    with pytest.raises(CapacityError) as exc:
        volume_provider().launch(spec(gpu="NVIDIA L4"))  # L4 has no stock in EU-RO-1
    assert "NVIDIA L4" in exc.value.reason and "EU-RO-1" in exc.value.reason
    assert "another GPU" in exc.value.reason
    assert fake.pods == {}


def test_unsupported_gpu_refused_before_create(fake: FakeRunPod) -> None:
    with pytest.raises(PermanentError):
        provider().launch(spec(gpu="Tesla T4"))
    assert fake.creates() == []


# ---------------------------------------------------------------- lifecycle


def test_retain_start_release(fake: FakeRunPod, fake_clock: FakeClock) -> None:
    p = provider()
    res = p.launch(spec())
    assert p.describe(REF, res).state == MachineState.running
    out = p.retain(REF, res)
    assert out.done and "still bills" in out.billing_note
    assert p.describe(REF, res).state == MachineState.stopped
    assert p.start(REF, res).done
    assert p.describe(REF, res).state == MachineState.running
    out = p.release(REF, res)
    assert out.done and fake.pods == {}
    fake_clock.advance(300)  # past the grace in which a new pod may still be invisible
    assert p.describe(REF, res).state == MachineState.gone
    again = p.release(REF, res)  # not found is success
    assert again.done


def test_release_waits_for_confirmation(fake: FakeRunPod) -> None:
    p = provider()
    res = p.launch(spec())
    fake.terminate_lag = 3
    first = p.release(REF, res)
    assert not first.done and "waiting for RunPod" in first.detail
    outcomes = [p.release(REF, res).done for _ in range(4)]
    assert outcomes[-1] and fake.pods == {}


def test_release_removes_duplicate_pods_with_the_run_name(fake: FakeRunPod) -> None:
    p = provider()
    res = p.launch(spec())
    dup = fake.add_pod(REF.name)
    other = fake.add_pod("my-own-notebook")
    assert p.release(REF, res).done
    assert dup not in fake.pods and set(fake.pods) == {other}


def test_resume_without_capacity(fake: FakeRunPod) -> None:
    p = provider()
    res = p.launch(spec())
    p.retain(REF, res)
    fake.resume_error = "There are not enough free GPUs on the host machine to start this pod."
    with pytest.raises(CapacityError) as exc:
        p.start(REF, res)
    assert "try again later" in exc.value.reason.lower()


def test_phantom_pod_is_pending_then_gone(fake: FakeRunPod, fake_clock: FakeClock) -> None:
    fake.phantom_create = True
    p = provider()
    res = p.launch(spec())
    assert res[0].id and res[0].created_at is not None
    assert p.describe(REF, res).state == MachineState.pending
    fake_clock.advance(600)
    assert p.describe(REF, res).state == MachineState.gone
    assert p.release(REF, res).done


def test_never_touches_a_pod_it_did_not_name(fake: FakeRunPod) -> None:
    p = provider()
    foreign = fake.add_pod("someone-else")
    res = [CloudResource(provider="runpod", kind="pod", id=foreign, name=REF.name)]
    with pytest.raises(PermanentError):
        p.release(REF, res)
    with pytest.raises(PermanentError):
        p.retain(REF, res)
    assert fake.pods[foreign]["desiredStatus"] == "RUNNING"
    assert "podTerminate" not in fake.ops() and "podStop" not in fake.ops()
    with pytest.raises(PermanentError):
        p.release(RunRef(deployment="other", org="o", run_id="r1"), [])


def test_list_managed_only_this_deployment(fake: FakeRunPod) -> None:
    mine = fake.add_pod("tensorant-test-run-1")
    fake.add_pod("tensorant-other-run-2")
    fake.add_pod("tensorant-testing-run-3")
    fake.add_pod("jupyter")
    managed = list(provider().list_managed())
    assert [(r.id, r.run_id, r.kind) for r in managed] == [(mine, "run-1", "pod")]


# ---------------------------------------------------------------- errors


def test_rotated_key_that_stops_working_is_an_auth_error(fake: FakeRunPod) -> None:
    res = provider().launch(spec())
    fake.api_key = "rpa_NEWKEY_ROTATED"
    old = provider()
    for call in (old.describe, old.retain, old.release):
        with pytest.raises(AuthError):
            call(REF, res)
    assert provider("rpa_NEWKEY_ROTATED").retain(REF, res).done


def test_graphql_permission_error_is_auth(fake: FakeRunPod) -> None:
    res = provider().launch(spec())
    fake.permission_denied = {"podStop"}
    with pytest.raises(AuthError) as exc:
        provider().retain(REF, res)
    assert "read/write" in exc.value.reason


def test_server_error_is_retryable_and_key_not_leaked(fake: FakeRunPod) -> None:
    fake.http_status = 500
    with pytest.raises(RetryableError) as exc:
        provider().launch(spec())
    assert KEY not in str(exc.value)
    with pytest.raises(RetryableError):
        provider().describe(REF, [])


def test_mounted_volume_replaces_presigned_urls(fake: FakeRunPod) -> None:
    env = {"TENSORANT_RUN_ID": "run-abc", "TENSORANT_DATASET_URL": "https://x/get?sig",
           "TENSORANT_ADAPTER_UPLOAD_URL": "https://x/put?sig", "TENSORANT_LOGS_UPLOAD_URL": "https://x/logs?sig",
           "TENSORANT_DATASET_KEY": "datasets/p/d.jsonl", "TENSORANT_ADAPTER_KEY": "runs/run-abc/adapter.zip",
           "TENSORANT_LOGS_KEY": "runs/run-abc/logs.txt"}
    volume_provider().launch(spec(env=env))
    sent = from_pod_env(fake.creates()[0]["variables"]["input"]["env"])
    assert sent["TENSORANT_STORAGE_DIR"] == "/workspace"
    assert sent["TENSORANT_ADAPTER_KEY"] == "runs/run-abc/adapter.zip"
    assert not any(k.endswith("_URL") for k in sent)
    assert sent["TENSORANT_DATA_DIR"] == "/workspace/data/run-abc"  # shared volume: per-run scratch


def test_volume_from_storage_forces_secure_cloud(fake: FakeRunPod) -> None:
    # The service fills the volume into a saved config with model_copy (no validation).
    cfg = RunPodConfig(api_key=SecretStr(KEY), cloud_type="COMMUNITY")
    cfg = cfg.model_copy(update={"network_volume_id": "vol0abc123", "datacenter_id": "EU-RO-1"})
    RunPodCompute(cfg, Settings(deployment_id="test")).launch(spec())
    assert fake.creates()[0]["variables"]["input"]["cloudType"] == "SECURE"


def test_importing_the_provider_loads_no_sdk() -> None:
    import subprocess
    import sys

    code = ("import sys, shared.providers.runpod.config, shared.providers.runpod.compute, shared.org_storage.s3, "
            "shared.org_storage.runpod_volume; print(sorted(m for m in ('runpod', 'boto3', 'requests') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_network_volumes_for_the_picker(fake: FakeRunPod) -> None:
    assert provider().network_volumes() == [
        {"id": "vol0abc123", "name": "tensorant", "size_gb": 100, "datacenter_id": "EU-RO-1"}]


def test_a_deployment_id_cannot_begin_another_deployments_pod_names(fake: FakeRunPod) -> None:
    # With hyphens, deployment `test` would read `tensorant-test-b-run-4` (deployment `test-b`) as its run `b-run-4`.
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="deployment_id"):
        Settings(deployment_id="test-b")
    fake.add_pod("tensorant-testb-run-4")
    assert list(provider().list_managed()) == []


def test_a_pod_names_its_org_so_it_is_attributable_without_the_store(fake: FakeRunPod) -> None:
    p = provider()
    [made] = p.launch(spec())
    old = fake.add_pod(REF.name)  # a pod named before the org was in the name: still the run's
    listed = {r.id: r for r in p.list_managed()}
    assert listed[made.id].org == "org1" and listed[made.id].run_id == "run-abc"
    assert listed[old].org == "" and listed[old].run_id == "run-abc"  # untagged: the sweeper cannot attribute it
    assert from_pod_env(fake.creates()[0]["variables"]["input"]["env"])["TENSORANT_POWEROFF"] == "runpod"
    assert {r.id for r in p.describe(REF, []).resources} == {made.id, old}
