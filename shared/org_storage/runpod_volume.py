"""A RunPod network volume as storage, through RunPod's S3-compatible API.

RunPod serves each datacenter's volumes at https://s3api-<datacenter, lowercased>.runpod.io
(RunPod docs, "S3-compatible API"); the volume ID is the bucket and the datacenter ID the
signing region. The S3 API key (access key `user_…`, secret `rps_…`) is created under
RunPod → Settings → S3 API Keys and is separate from the compute API key (`rpa_…`).

Everything S3 is delegated to an S3Storage built for that endpoint (composition).

Agent access: agent_env returns presigned URLs (one object, one method, short-lived) for
any compute, plus the keys relative to the volume root. A RunPod pod mounts the volume at
/workspace, so RunPodCompute.launch replaces the URLs with TENSORANT_STORAGE_DIR=/workspace
and the pod reads and writes the keys as files: the one case where the agent sees no
presigned URL, and needs none, because the mount is the access.
"""

from __future__ import annotations

import re
from typing import BinaryIO

from shared.models import Check, CheckStatus
from shared.org_storage.base import Readable, adapter_key, logs_key, merged_key
from shared.org_storage.config import RunPodVolumeConfig, S3StorageConfig
from shared.org_storage.s3 import AGENT_URL_TTL_S, S3Storage

_COMPUTE_KEY = re.compile(r"^(rpa_[A-Za-z0-9]+|[A-Z0-9]{32,})$")
COMPUTE_KEY_MESSAGE = (
    "This looks like the RunPod compute API key, not an S3 API key. Create an S3 API key under RunPod → "
    "Settings → S3 API Keys and enter its access key (user_…) and secret (rps_…); the compute key manages pods "
    "and does not open the network volume."
)


def volume_endpoint(datacenter_id: str) -> str:
    return f"https://s3api-{datacenter_id.lower()}.runpod.io"


def looks_like_compute_key(value: str) -> bool:
    return bool(_COMPUTE_KEY.match(value.strip()))


class RunPodVolumeStorage:
    kind = "runpod_volume"

    def __init__(self, config: RunPodVolumeConfig, *, endpoint: str | None = None,
                 url_ttl_s: int = AGENT_URL_TTL_S) -> None:
        """`endpoint` overrides the derived S3 endpoint (tests only)."""
        self.config = config
        self.endpoint = endpoint or volume_endpoint(config.datacenter_id)
        self.s3 = S3Storage(
            S3StorageConfig(endpoint=self.endpoint, region=config.datacenter_id, bucket=config.volume_id,
                            access_key_id=config.access_key_id, secret_access_key=config.secret_access_key),
            url_ttl_s=url_ttl_s, label="network volume",
        )

    def location(self) -> str:
        return f"runpod-volume://{self.config.datacenter_id}/{self.config.volume_id}"

    def validate(self) -> list[Check]:
        secret = self.config.secret_access_key.get_secret_value()
        if looks_like_compute_key(self.config.access_key_id) or looks_like_compute_key(secret):
            return [Check(name="s3 key", status=CheckStatus.fail, message=COMPUTE_KEY_MESSAGE)]
        checks: list[Check] = []
        if not self.config.access_key_id.startswith("user_"):
            checks.append(Check(name="s3 key", status=CheckStatus.warn, message=(
                "RunPod S3 access keys look like user_… (your RunPod user ID); check that this is the S3 API key")))
        probes = self.s3.validate()
        for check in probes:
            if check.status == CheckStatus.fail and "access key" in check.message:
                check = check.model_copy(update={"message": check.message + ". Use the S3 API key (RunPod → "
                                                 "Settings → S3 API Keys), not the compute API key."})
            elif check.status == CheckStatus.fail and "cannot reach the endpoint" in check.message:
                # The owner typed no URL: the endpoint comes from the datacenter, and RunPod offers the
                # S3-compatible API only in some datacenters, so say that instead of "check the URL".
                check = check.model_copy(update={"message": (
                    f"cannot reach RunPod's S3-compatible API for datacenter {self.config.datacenter_id} "
                    f"({self.endpoint}). RunPod offers the S3 API only in some datacenters: check the datacenter "
                    "ID (e.g. EU-RO-1, as shown on the volume) and that the volume is in a datacenter with S3 API "
                    "support; otherwise create the volume in one that has it.")})
            checks.append(check)
        return checks

    def put(self, key: str, data: bytes) -> None:
        self.s3.put(key, data)

    def put_stream(self, key: str, stream: Readable) -> int:
        return self.s3.put_stream(key, stream)

    def open_stream(self, key: str, max_bytes: int) -> BinaryIO:
        return self.s3.open_stream(key, max_bytes)

    def open_range(self, key: str, start: int, max_bytes: int) -> tuple[BinaryIO, int]:
        return self.s3.open_range(key, start, max_bytes)  # the volume's S3 API serves ranged GETs

    def upload_url(self, key: str, ttl_s: int) -> str | None:
        return self.s3.upload_url(key, ttl_s)

    def get(self, key: str, max_bytes: int) -> bytes:
        return self.s3.get(key, max_bytes)

    def delete(self, key: str) -> None:
        self.s3.delete(key)

    def delete_prefix(self, prefix: str) -> int:
        return self.s3.delete_prefix(prefix)

    def download_url(self, key: str, ttl_s: int) -> str | None:
        return self.s3.download_url(key, ttl_s)

    def agent_env(self, run_id: str, dataset: str, *, ttl_s: int | None = None,
                  merged: bool = False, checkpoints: int = 0,
                  validation: str = "") -> tuple[dict[str, str], frozenset[str]]:
        env, secret = self.s3.agent_env(run_id, dataset, ttl_s=ttl_s, merged=merged, checkpoints=checkpoints,
                                        validation=validation)
        env.update({
            "TENSORANT_DATASET_KEY": dataset,
            "TENSORANT_ADAPTER_KEY": adapter_key(run_id),
            "TENSORANT_LOGS_KEY": logs_key(run_id),
            **({"TENSORANT_MERGED_KEY": merged_key(run_id)} if merged else {}),
        })
        return env, secret
