"""What an owner saves as the organization's storage connection (one backend per org)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from shared.settings import get_settings


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LocalStorageConfig(_Config):
    """Always <TENSORANT_LOCAL_ROOT>/storage/<org>: the control plane's own root, never a path an
    owner names (one could otherwise read and write another org's data or any host directory)."""

    kind: Literal["local"] = "local"
    directory: str = Field(default="", description="always empty: the directory is the operator's, per org")

    @field_validator("directory")
    @classmethod
    def _directory(cls, v: str) -> str:
        if v:
            raise ValueError("local storage always lives under the control plane's TENSORANT_LOCAL_ROOT, one "
                             "directory per organization; leave directory empty")
        return v


class S3StorageConfig(_Config):
    kind: Literal["s3"] = "s3"
    endpoint: str = Field(default="", description="https URL; empty for AWS S3 in `region`")
    # The region goes into the AWS endpoint's host name: letters, digits and hyphens only.
    region: str = Field(min_length=2, max_length=40, pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]$",
                        description="The bucket's region, e.g. us-east-1")
    bucket: str = Field(min_length=3, max_length=63, description="The bucket's name (not its ARN)")
    prefix: str = Field(default="", description="Optional: a folder in the bucket for this organization's objects")
    access_key_id: str = Field(min_length=4, max_length=128, description="An access key ID allowed on the bucket")
    secret_access_key: SecretStr = Field(description="The access key's secret")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if not v:
            return v
        if re.match(r"^(?:https?://)?[^/]+\.(?:blob|dfs)\.core\.windows\.net(?:[:/]|$)", v.strip(), re.I):
            # The Azure product document: an Azure subscription does not make Azure Blob Storage an S3 endpoint.
            raise ValueError("an Azure Blob Storage URL (*.blob.core.windows.net) is not an S3 endpoint: Blob Storage "
                             "has no S3 API, even with an Azure subscription. Use an S3-compatible service's endpoint "
                             "(AWS S3: leave endpoint empty), or keep RunPod network storage")
        if not re.match(r"^https?://[A-Za-z0-9.\-\[\]:]+/?$", v):
            raise ValueError("endpoint must be a URL like https://s3.example.com (no path)")
        # allow_private_endpoints: a test-only allowance (moto on loopback http)
        if not v.startswith("https://") and not get_settings().allow_private_endpoints:
            raise ValueError("endpoint must be an https:// URL")
        return v.rstrip("/")

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str) -> str:
        if not re.match(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$", v):
            raise ValueError("bucket must be a bucket name (lowercase letters, digits, dots, hyphens), not a URL or ARN")
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        v = v.strip("/")
        if ".." in v.split("/"):
            raise ValueError("prefix may not contain '..'")
        return v


class RunPodVolumeConfig(_Config):
    kind: Literal["runpod_volume"] = "runpod_volume"
    volume_id: str = Field(min_length=4, max_length=64, pattern=r"^[a-z0-9]+$", description=(
        "The network volume's ID (pick it from the list, or see RunPod's Storage page)"))
    datacenter_id: str = Field(min_length=3, max_length=32, pattern=r"^[A-Z]{2,3}-[A-Z]{2,4}-\d+$", description=(
        "The volume's datacenter, e.g. EU-RO-1: pods run there"))
    access_key_id: str = Field(min_length=4, max_length=128, description=(
        "The RunPod S3 API key's access key (user_...), not the RunPod API key"))
    secret_access_key: SecretStr = Field(description="The S3 API key's secret (rps_...)")


StorageConfig = Annotated[
    LocalStorageConfig | S3StorageConfig | RunPodVolumeConfig, Field(discriminator="kind")
]
