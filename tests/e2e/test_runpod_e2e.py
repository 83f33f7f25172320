"""End to end on RunPod with a network volume, through the real function handlers.

RunPod is the fake GraphQL server on loopback; the volume's S3 API is moto in server
mode (its derived endpoint is pointed at moto); a test-side agent plays the pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from shared.settings import reset_settings
from tests.harness import ApiError, Harness, trained_adapter_zip
from tests.providers.runpod.fake_server import FakeRunPod
from tests.support.pods import from_pod_env

pytestmark = pytest.mark.e2e

KEY = "rpa_E2EKEY0123456789"
VOLUME = {"kind": "runpod_volume", "volume_id": "vol0abc123", "datacenter_id": "EU-RO-1",
          "access_key_id": "user_2f21CfO73Mm2Uq2lEGFiEF24IPw", "secret_access_key": "rps_E2ESECRET0123456789"}


@pytest.fixture
def runpod(monkeypatch: pytest.MonkeyPatch, module_s3_url: str) -> Iterator[FakeRunPod]:
    from shared.org_storage import runpod_volume

    fake = FakeRunPod(api_key=KEY).start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)
    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")  # moto listens on loopback http
    reset_settings()
    monkeypatch.setattr(runpod_volume, "volume_endpoint", lambda datacenter: module_s3_url)
    yield fake
    fake.stop()


@pytest.fixture
def runpod_h(env: dict[str, str], runpod: FakeRunPod) -> Iterator[Harness]:
    harness = Harness()
    storage = harness.save_storage(dict(VOLUME))
    assert storage["status"] == "connected", storage["checks"]
    compute = harness.save_compute("runpod", {"api_key": KEY})
    assert compute["status"] == "connected", compute["checks"]
    yield harness
    harness.close()


def offer_in_volume_datacenter(harness: Harness) -> str:
    offers = harness.ok("GET", "/api/catalog/gpus", params={"provider": "runpod"})["items"]
    assert offers and all(o["region"] == "EU-RO-1" for o in offers)
    assert not any("T4" in o["gpu"] for o in offers)
    return str(next(o for o in offers if o["machine_type"] == "NVIDIA A40")["offer_id"])


def test_trial_on_runpod_volume_succeeds_and_pod_is_gone(runpod_h: Harness, runpod: FakeRunPod) -> None:
    checks = {c["name"]: c for c in runpod_h.ok("GET", "/api/connections/compute/runpod")["checks"]}
    assert "cannot prove write permissions" in checks["write permissions"]["message"]
    run_id = runpod_h.create_run("runpod", offer_in_volume_datacenter(runpod_h))
    run = runpod_h.launch(run_id)
    assert run["state"] == "provisioning", run["reason"]
    assert [r["kind"] for r in run["resources"]] == ["pod"]
    sent = runpod.creates()[0]["variables"]["input"]
    assert sent["networkVolumeId"] == "vol0abc123" and sent["dataCenterId"] == "EU-RO-1"
    env = from_pod_env(sent["env"])
    assert env["TENSORANT_STORAGE_DIR"] == "/workspace"
    assert not {"TENSORANT_DATASET_URL", "TENSORANT_ADAPTER_UPLOAD_URL", "TENSORANT_LOGS_UPLOAD_URL"} & set(env)
    assert env["TENSORANT_ADAPTER_KEY"] == f"runs/{run_id}/adapter.zip"

    runpod_h.agent(run_id).train(trained_adapter_zip())
    run = runpod_h.get_run(run_id)
    assert run["state"] == "succeeded", run["reason"]
    assert runpod.pods == {}  # terminated and confirmed gone
    assert "podTerminate" in runpod.ops()


def test_failed_export_stops_pod_then_saved_adapter_recovers(runpod_h: Harness, runpod: FakeRunPod) -> None:
    run_id = runpod_h.create_run("runpod", offer_in_volume_datacenter(runpod_h))
    runpod_h.launch(run_id)
    agent = runpod_h.agent(run_id)
    agent.heartbeat("training", 0.9)
    agent.upload(trained_adapter_zip())  # the adapter made it to the volume, the export step then failed
    agent.complete_failed("export failed: upload step crashed")
    run = runpod_h.get_run(run_id)
    assert run["state"] == "retained", run["reason"]
    assert "still bill" in run["billing_note"]
    (pod,) = runpod.pods.values()
    assert pod["desiredStatus"] == "EXITED"  # stopped, files kept

    run = runpod_h.recover(run_id)  # verify the saved adapter on the volume
    assert run["state"] == "succeeded", run["reason"]
    assert runpod.pods == {}


# ---------------------------------------------------------------- the pod's working files on the volume


def volume_s3(module_s3_url: str) -> Any:
    return boto3.client("s3", endpoint_url=module_s3_url, region_name="us-east-1", aws_access_key_id="AKIAROOT0000",
                        aws_secret_access_key="x" * 40)


SCRATCH_FILES = ("dataset.jsonl", "adapter.zip", "logs.txt", "agent-state.json", "adapter/adapter_model.safetensors",
                 "adapter/adapter_config.json")


def pod_writes_scratch(s3: Any, run_id: str, env: dict[str, str]) -> list[str]:
    """What the pod's agent leaves in its data directory on the volume (mounted at /workspace)."""
    assert env["TENSORANT_DATA_DIR"] == f"/workspace/data/{run_id}"
    folder = env["TENSORANT_DATA_DIR"].removeprefix("/workspace/")
    keys = [f"{folder}/{name}" for name in SCRATCH_FILES]
    for key in keys:
        s3.put_object(Bucket="vol0abc123", Key=key, Body=b'{"run_token": "secret"}')
    return keys


def volume_keys(s3: Any, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket="vol0abc123", Prefix=prefix).get("Contents") or []]


def test_success_removes_the_pods_working_files_but_serves_the_adapter(
        runpod_h: Harness, runpod: FakeRunPod, module_s3_url: str) -> None:
    import hashlib

    import requests

    s3 = volume_s3(module_s3_url)
    other = "r0neighbour"  # another run's working files: never touched
    s3.put_object(Bucket="vol0abc123", Key=f"data/{other}/agent-state.json", Body=b"{}")
    run_id = runpod_h.create_run("runpod", offer_in_volume_datacenter(runpod_h))
    runpod_h.launch(run_id)
    pod_writes_scratch(s3, run_id, from_pod_env(runpod.creates()[0]["variables"]["input"]["env"]))
    zip_bytes = trained_adapter_zip()
    runpod_h.agent(run_id).train(zip_bytes)
    run = runpod_h.get_run(run_id)
    assert run["state"] == "succeeded", run["reason"]
    assert volume_keys(s3, f"data/{run_id}") == []
    assert volume_keys(s3, f"data/{other}/") == [f"data/{other}/agent-state.json"]
    assert volume_keys(s3, f"runs/{run_id}/") == [f"runs/{run_id}/adapter.zip"]
    assert any("removed the pod's working files" in e["message"] for e in run["events"])
    link = runpod_h.ok("GET", f"/api/runs/{run_id}/adapter", token="member")
    got = requests.get(link["url"], timeout=10).content
    assert got == zip_bytes and hashlib.sha256(got).hexdigest() == run["adapter_sha256"]
    # A redelivered release message finds nothing more to remove, and the run stays succeeded.
    from shared.models import StepMessage
    from shared.queues import get_queues
    from shared.steps import Step

    get_queues().send(Step.release, StepMessage(org=runpod_h.org, run_id=run_id))
    runpod_h.drain()
    assert runpod_h.get_run(run_id)["state"] == "succeeded"


def test_retained_run_keeps_the_pods_working_files_until_recovered(
        runpod_h: Harness, runpod: FakeRunPod, module_s3_url: str) -> None:
    s3 = volume_s3(module_s3_url)
    run_id = runpod_h.create_run("runpod", offer_in_volume_datacenter(runpod_h))
    runpod_h.launch(run_id)
    keys = pod_writes_scratch(s3, run_id, from_pod_env(runpod.creates()[0]["variables"]["input"]["env"]))
    agent = runpod_h.agent(run_id)
    agent.heartbeat("training", 0.9)
    agent.upload(trained_adapter_zip())
    agent.complete_failed("export failed: upload step crashed")
    assert runpod_h.get_run(run_id)["state"] == "retained"
    assert sorted(volume_keys(s3, f"data/{run_id}/")) == sorted(keys)  # recovery may need them
    run = runpod_h.recover(run_id)
    assert run["state"] == "succeeded", run["reason"]
    assert volume_keys(s3, f"data/{run_id}/") == []
    assert volume_keys(s3, f"runs/{run_id}/") == [f"runs/{run_id}/adapter.zip"]


def test_storage_location_cannot_change_once_a_project_exists(runpod_h: Harness) -> None:
    runpod_h.project_and_dataset()
    with pytest.raises(ApiError) as exc:
        runpod_h.ok("PUT", "/api/connections/storage", json_body={**VOLUME, "volume_id": "vol0other99"})
    assert exc.value.status == 409
    assert "migration" in str(exc.value.body)
    # Rotating the S3 credentials for the same volume is allowed.
    rotated = runpod_h.save_storage({**VOLUME, "secret_access_key": "rps_ROTATED0123456789"})
    assert rotated["status"] == "connected", rotated["checks"]


# ---------------------------------------------------------------- RunPod compute with custom S3 storage


@pytest.fixture
def h_s3(env: dict[str, str], runpod: FakeRunPod, module_s3_url: str) -> Iterator[Harness]:
    boto3.client("s3", endpoint_url=module_s3_url, region_name="us-east-1", aws_access_key_id="AKIAROOT0000",
                 aws_secret_access_key="x" * 40).create_bucket(Bucket="tensorant-e2e")
    harness = Harness()
    storage = harness.save_storage({"kind": "s3", "endpoint": module_s3_url, "region": "us-east-1",
                                    "bucket": "tensorant-e2e", "prefix": "org-a", "access_key_id": "AKIAE2ETEST0001",
                                    "secret_access_key": "e2e-secret-0123456789abcdefghij"})
    assert storage["status"] == "connected", storage["checks"]
    assert harness.save_compute("runpod", {"api_key": KEY})["status"] == "connected"
    yield harness
    harness.close()


def test_custom_s3_agent_uses_presigned_urls_and_upload_recovers(h_s3: Harness, runpod: FakeRunPod) -> None:
    import hashlib

    import requests

    h = h_s3
    offers = h.ok("GET", "/api/catalog/gpus", params={"provider": "runpod"})["items"]
    offer = next(o for o in offers if o["machine_type"] == "NVIDIA A40")
    run_id = h.create_run("runpod", offer["offer_id"])
    h.launch(run_id)
    sent = runpod.creates()[0]["variables"]["input"]
    assert "networkVolumeId" not in sent and sent["volumeInGb"] > 0
    env = from_pod_env(sent["env"])
    assert env["TENSORANT_DATA_DIR"] == "/workspace/data" and "TENSORANT_STORAGE_DIR" not in env
    assert "e2e-secret-0123456789abcdefghij" not in str(env)

    # The pod's agent works with plain HTTP on its presigned URLs only.
    dataset = requests.get(env["TENSORANT_DATASET_URL"], timeout=10)
    assert dataset.status_code == 200 and b"assistant" in dataset.content
    assert requests.put(env["TENSORANT_LOGS_UPLOAD_URL"], data=b"step 1\n", timeout=10).status_code == 200
    agent = h.agent(run_id)
    agent.heartbeat("training", 0.5)
    agent.complete_failed("export failed")
    run = h.get_run(run_id)
    assert run["state"] == "retained" and "still bills" in run["billing_note"]

    # Custom S3: the user retrieves /workspace/data/adapter.zip from the pod and uploads it.
    zip_bytes = trained_adapter_zip()
    run = h.recover(run_id, upload=zip_bytes)
    assert run["state"] == "succeeded", run["reason"]
    assert run["adapter_sha256"] == hashlib.sha256(zip_bytes).hexdigest()
    assert runpod.pods == {}
    # S3 storage: the adapter is handed out as a short-lived presigned GET.
    link = h.ok("GET", f"/api/runs/{run_id}/adapter", token="member")
    assert (link["sha256"], link["size"]) == (run["adapter_sha256"], len(zip_bytes)) and link["expires_at"]
    assert requests.get(link["url"], timeout=10).content == zip_bytes


def test_launch_sends_the_real_image_and_the_runs_training_settings(runpod_h: Harness, runpod: FakeRunPod) -> None:
    from shared.settings import get_settings
    from tests.e2e.wire import TRAINING, assert_training_sent

    runpod_h.ok("PUT", "/api/org/secrets/huggingface-token", json_body={"token": "hf_podWireToken0123456789"})
    run_id = runpod_h.create_run("runpod", offer_in_volume_datacenter(runpod_h), training=TRAINING)
    run = runpod_h.launch(run_id)
    sent = runpod.creates()[0]["variables"]["input"]
    assert sent["imageName"] == get_settings().container_image
    env = from_pod_env(sent["env"])
    assert_training_sent(env, run)
    assert env["HF_TOKEN"] == "hf_podWireToken0123456789"
