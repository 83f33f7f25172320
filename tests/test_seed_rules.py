"""Product-document rules that were implemented without a test, and one that was missing (issue 41.16)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.org_storage.config import S3StorageConfig
from shared.providers import cloudinit
from shared.providers.base import Bootstrap

CLAIM = "tcl1.org-1.r-1." + "0" * 64


@pytest.mark.parametrize("endpoint", ["https://acct.blob.core.windows.net", "https://acct.blob.core.windows.net/data",
                                      "acct.blob.core.windows.net", "https://acct.dfs.core.windows.net"])
def test_an_azure_blob_url_is_not_an_s3_endpoint(endpoint: str) -> None:
    """Azure document: 'An Azure subscription does not make Azure Blob Storage an S3 endpoint.'"""
    with pytest.raises(ValidationError) as info:
        S3StorageConfig(endpoint=endpoint, region="eastus", bucket="data", access_key_id="AKIA0000",
                        secret_access_key="secret-value")  # type: ignore[arg-type]
    text = str(info.value)
    assert "not an S3 endpoint" in text and "Blob Storage" in text, text


def test_an_s3_compatible_endpoint_is_still_accepted() -> None:
    got = S3StorageConfig(endpoint="https://s3.eu-central-1.wasabisys.com", region="eu-central-1", bucket="data",
                          access_key_id="AKIA0000", secret_access_key="secret-value")  # type: ignore[arg-type]
    assert got.endpoint == "https://s3.eu-central-1.wasabisys.com"


def test_vm_recovery_paths_match_the_aws_and_azure_documents() -> None:
    """AWS and Azure documents: 'download /var/lib/tensorant/data/adapter.zip ... The host's data directory is
    /workspace/data in the container.' The machine mounts exactly that host directory there (the agent keeps
    adapter.zip, or runs/RUN_ID/adapter.zip with RunPod network storage, under it:
    tests/test_agent_local.py::test_archive_path_follows_the_docs_for_runpod_network_storage_on_a_cloud_host)."""
    assert cloudinit.HOST_DATA_DIR == "/var/lib/tensorant/data" and cloudinit.CONTAINER_DATA_DIR == "/workspace/data"
    text = cloudinit.render(Bootstrap(container_image="ghcr.io/tensorant/trainer:1",
                                      env={"TENSORANT_RUN_ID": "r-1", "TENSORANT_API_URL": "https://cp.example.com"}),
                            CLAIM)
    assert "DATA=/var/lib/tensorant/data" in text and '-v "$DATA:/workspace/data"' in text
