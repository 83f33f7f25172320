"""S3Storage against moto in server mode (real HTTP, real boto3 wire protocol)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
import requests

from shared.errors import RetryableError
from shared.models import CheckStatus
from shared.org_storage.base import ObjectMissing, adapter_key
from shared.org_storage.config import S3StorageConfig
from shared.org_storage.s3 import S3Storage
from tests.storage.moto_s3 import free_port, presigned_signature_valid

SECRET = "s3cr3t-Access-Key-For-Tests-0123456789ab"


def storage(url: str, bucket: str = "tensorant-data", prefix: str = "org-a") -> S3Storage:
    cfg = S3StorageConfig(endpoint=url, region="us-east-1", bucket=bucket, prefix=prefix,
                          access_key_id="AKIATESTKEY00001", secret_access_key=SECRET)  # type: ignore[arg-type]
    return S3Storage(cfg)


def raw_keys(url: str) -> list[str]:
    c = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="AKIAROOT0000",
                     aws_secret_access_key="x" * 40)
    return [o["Key"] for o in c.list_objects_v2(Bucket="tensorant-data").get("Contents", [])]


def test_validate_probe_write_read_delete(module_s3_url: str) -> None:
    checks = storage(module_s3_url).validate()
    assert [(c.name, c.status) for c in checks] == [
        ("write", CheckStatus.ok), ("read", CheckStatus.ok), ("delete", CheckStatus.ok)]
    assert not [k for k in raw_keys(module_s3_url) if ".tensorant-probe" in k]


def test_validate_missing_bucket_says_so(module_s3_url: str) -> None:
    checks = storage(module_s3_url, bucket="no-such-bucket").validate()
    assert checks[0].name == "write" and checks[0].status == CheckStatus.fail
    assert "no-such-bucket does not exist" in checks[0].message
    assert [c.status for c in checks[1:]] == [CheckStatus.warn, CheckStatus.warn]


def test_validate_unreachable_endpoint(module_s3_url: str) -> None:
    checks = storage(f"http://127.0.0.1:{free_port()}").validate()
    assert checks[0].status == CheckStatus.fail and "cannot reach the endpoint" in checks[0].message


def test_put_get_delete_under_prefix(module_s3_url: str) -> None:
    s = storage(module_s3_url)
    s.put(adapter_key("run-1"), b"zipbytes")
    assert "org-a/runs/run-1/adapter.zip" in raw_keys(module_s3_url)
    assert s.get(adapter_key("run-1"), 8) == b"zipbytes"
    with pytest.raises(ValueError):
        s.get(adapter_key("run-1"), 7)
    s.delete(adapter_key("run-1"))
    with pytest.raises(ObjectMissing):
        s.get(adapter_key("run-1"), 100)
    s.delete(adapter_key("run-1"))  # deleting a missing object is fine
    with pytest.raises(ValueError):
        s.put("../escape", b"x")


def test_delete_prefix_removes_one_folder_only(module_s3_url: str) -> None:
    s = storage(module_s3_url)
    for key in ("data/r1/agent-state.json", "data/r1/adapter/adapter_model.safetensors", "data/r10/logs.txt",
                "runs/r1/adapter.zip"):
        s.put(key, b"x")
    assert s.delete_prefix("data/r1/") == 2
    left = raw_keys(module_s3_url)
    assert "org-a/data/r10/logs.txt" in left and "org-a/runs/r1/adapter.zip" in left
    assert not [k for k in left if k.startswith("org-a/data/r1/")]
    assert s.delete_prefix("data/r1/") == 0  # nothing there: done
    with pytest.raises(ValueError):
        s.delete_prefix("data/r1")  # would also match data/r10
    with pytest.raises(ValueError):
        s.delete_prefix("../data/")


def test_unreachable_put_is_retryable(module_s3_url: str) -> None:
    with pytest.raises(RetryableError):
        storage(f"http://127.0.0.1:{free_port()}").put("runs/r/logs.txt", b"x")


def test_agent_env_presigned_urls_work_and_are_narrow(module_s3_url: str) -> None:
    s = storage(module_s3_url)
    s.put("datasets/p1/d1.jsonl", b'{"text": "hi"}\n')
    env, secret_keys = s.agent_env("run-7", "datasets/p1/d1.jsonl")
    assert set(env) == {"TENSORANT_DATASET_URL", "TENSORANT_ADAPTER_UPLOAD_URL", "TENSORANT_LOGS_UPLOAD_URL"}
    assert secret_keys == frozenset(env)
    assert not any(SECRET in v for v in env.values())  # never the organization's secret
    for url in env.values():
        assert parse_qs(urlsplit(url).query)["X-Amz-Expires"] == ["43200"]  # 12 hours

    assert requests.get(env["TENSORANT_DATASET_URL"], timeout=10).content == b'{"text": "hi"}\n'
    assert requests.put(env["TENSORANT_ADAPTER_UPLOAD_URL"], data=b"ADAPTER", timeout=10).status_code == 200
    assert s.get(adapter_key("run-7"), 100) == b"ADAPTER"
    assert requests.put(env["TENSORANT_LOGS_UPLOAD_URL"], data=b"log\n", timeout=10).status_code == 200
    assert "org-a/runs/run-7/logs.txt" in raw_keys(module_s3_url)

    # Each URL is signed for one key and one method only.
    put_url = env["TENSORANT_ADAPTER_UPLOAD_URL"]
    assert presigned_signature_valid(put_url, "PUT", SECRET)
    assert not presigned_signature_valid(put_url, "GET", SECRET)
    assert not presigned_signature_valid(put_url.replace("run-7/adapter.zip", "run-8/adapter.zip"), "PUT", SECRET)
    assert not presigned_signature_valid(put_url.replace("/org-a/", "/org-b/"), "PUT", SECRET)
    get_url = env["TENSORANT_DATASET_URL"]
    assert presigned_signature_valid(get_url, "GET", SECRET)
    assert not presigned_signature_valid(get_url, "PUT", SECRET)
    assert not presigned_signature_valid(get_url.replace("d1.jsonl", "d2.jsonl"), "GET", SECRET)


def test_location_and_custom_ttl(module_s3_url: str) -> None:
    s = storage(module_s3_url)
    assert s.location() == f"s3://tensorant-data/org-a at {module_s3_url}"
    env, _ = s.agent_env("run-9", "datasets/p/d.jsonl", ttl_s=3 * 86400)
    assert parse_qs(urlsplit(env["TENSORANT_DATASET_URL"]).query)["X-Amz-Expires"] == [str(3 * 86400)]


def test_agent_env_checkpoint_slots_and_validation_set(module_s3_url: str) -> None:
    """Issue 42.4: one PUT URL per kept checkpoint slot, and a GET URL for the validation dataset; all secret."""
    import json

    from shared.org_storage.base import checkpoint_key

    s = storage(module_s3_url)
    s.put("datasets/p1/v1.jsonl", b'{"text": "held"}\n')
    env, secret_keys = s.agent_env("run-7", "datasets/p1/d1.jsonl", checkpoints=2, validation="datasets/p1/v1.jsonl")
    assert secret_keys == frozenset(env)
    slots = json.loads(env["TENSORANT_CHECKPOINT_UPLOAD_URLS"])
    assert len(slots) == 2
    for i, url in enumerate(slots):
        assert requests.put(url, data=f"slot {i}".encode(), timeout=10).status_code == 200
        assert s.get(checkpoint_key("run-7", i), 100) == f"slot {i}".encode()
        assert not presigned_signature_valid(url, "GET", SECRET)
    assert requests.get(env["TENSORANT_EVAL_DATASET_URL"], timeout=10).content == b'{"text": "held"}\n'
    assert not presigned_signature_valid(env["TENSORANT_EVAL_DATASET_URL"], "PUT", SECRET)
