"""RunPodVolumeStorage: endpoint derivation, key checks, and S3 traffic against moto in server mode."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import requests

from shared.models import CheckStatus
from shared.org_storage.base import adapter_key
from shared.org_storage.config import RunPodVolumeConfig
from shared.org_storage.registry import make_storage
from shared.org_storage.runpod_volume import RunPodVolumeStorage, volume_endpoint
from shared.settings import Settings

SECRET = "rps_TESTSECRET0123456789abcdef"


def config(access: str = "user_2f21CfO73Mm2Uq2lEGFiEF24IPw", secret: str = SECRET,
           dc: str = "EU-RO-1") -> RunPodVolumeConfig:
    return RunPodVolumeConfig(volume_id="vol0abc123", datacenter_id=dc, access_key_id=access,
                              secret_access_key=secret)  # type: ignore[arg-type]


def test_endpoint_derived_from_datacenter() -> None:
    assert volume_endpoint("EU-RO-1") == "https://s3api-eu-ro-1.runpod.io"
    assert volume_endpoint("US-KS-2") == "https://s3api-us-ks-2.runpod.io"
    s = RunPodVolumeStorage(config())
    assert s.endpoint == "https://s3api-eu-ro-1.runpod.io"
    assert s.s3.config.bucket == "vol0abc123" and s.s3.config.region == "EU-RO-1"
    assert s.location() == "runpod-volume://EU-RO-1/vol0abc123"
    # The location does not depend on credentials: rotating the S3 key keeps it.
    assert RunPodVolumeStorage(config(secret="rps_OTHER0000000000")).location() == s.location()
    assert isinstance(make_storage(config(), Settings(), "org"), RunPodVolumeStorage)


def test_compute_key_pasted_as_s3_key_is_named() -> None:
    for cfg in (config(secret="rpa_ABCDEF0123456789"), config(access="rpa_ABCDEF0123456789"),
                config(secret="ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789ABCD")):
        checks = RunPodVolumeStorage(cfg, endpoint="http://127.0.0.1:9").validate()
        assert [c.status for c in checks] == [CheckStatus.fail]
        assert "compute API key" in checks[0].message and "S3 API Keys" in checks[0].message


def test_validate_probe_on_volume(module_s3_url: str) -> None:
    checks = RunPodVolumeStorage(config(), endpoint=module_s3_url).validate()
    assert [(c.name, c.status) for c in checks] == [
        ("write", CheckStatus.ok), ("read", CheckStatus.ok), ("delete", CheckStatus.ok)]


def test_missing_volume_named_as_volume(module_s3_url: str) -> None:
    cfg = RunPodVolumeConfig(volume_id="volmissing1", datacenter_id="EU-RO-1", access_key_id="user_abc",
                             secret_access_key=SECRET)  # type: ignore[arg-type]
    checks = RunPodVolumeStorage(cfg, endpoint=module_s3_url).validate()
    assert checks[0].status == CheckStatus.fail and "network volume volmissing1 does not exist" in checks[0].message


def test_unreachable_volume_endpoint_points_to_the_datacenter_not_a_url() -> None:
    import socket

    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    checks = RunPodVolumeStorage(config(dc="US-TX-3"), endpoint=f"http://127.0.0.1:{port}").validate()
    write = next(c for c in checks if c.name == "write")
    assert write.status == CheckStatus.fail
    assert "US-TX-3" in write.message and "S3 API only in some datacenters" in write.message
    assert "check the URL" not in write.message  # the owner entered no URL


def test_agent_env_urls_signed_for_datacenter_and_keys(module_s3_url: str) -> None:
    s = RunPodVolumeStorage(config(), endpoint=module_s3_url)
    s.put("datasets/p1/d1.jsonl", b"{}\n")
    env, secret_keys = s.agent_env("run-1", "datasets/p1/d1.jsonl")
    assert env["TENSORANT_ADAPTER_KEY"] == "runs/run-1/adapter.zip"
    assert env["TENSORANT_DATASET_KEY"] == "datasets/p1/d1.jsonl"
    assert secret_keys == {"TENSORANT_DATASET_URL", "TENSORANT_ADAPTER_UPLOAD_URL", "TENSORANT_LOGS_UPLOAD_URL"}
    cred = parse_qs(urlsplit(env["TENSORANT_ADAPTER_UPLOAD_URL"]).query)["X-Amz-Credential"][0]
    assert "/EU-RO-1/s3/" in cred  # the datacenter is the signing region
    assert urlsplit(env["TENSORANT_ADAPTER_UPLOAD_URL"]).path == "/vol0abc123/runs/run-1/adapter.zip"
    assert requests.put(env["TENSORANT_ADAPTER_UPLOAD_URL"], data=b"Z", timeout=10).status_code == 200
    assert s.get(adapter_key("run-1"), 10) == b"Z"
    assert not any(SECRET in v for v in env.values())
