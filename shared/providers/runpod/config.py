"""What an owner saves as the RunPod compute connection. Imports no SDK."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from shared.org_storage.config import RunPodVolumeConfig


class RunPodConfig(BaseModel):
    """The RunPod compute connection.

    `api_key` is the RunPod API key (Restricted, read/write on pods; network-volume
    discovery when storage is a RunPod volume). It is not the S3 API key of the storage
    connection: the two are not interchangeable.

    `network_volume_id` and `datacenter_id` are not typed by the user on the compute
    card: when the organization's storage connection is a RunPod network volume, the
    service that builds the provider fills them from that storage config (with_storage
    below, the provider's registry hook) before constructing RunPodCompute.
    Then offers list only GPUs in that datacenter and every pod mounts the volume at
    /workspace, pinned to that datacenter. Empty = custom S3 (pods get their own volume).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_key: SecretStr = Field(description="The RunPod API key (Restricted: read/write on pods), not the S3 API key")
    # Network volumes exist only in Secure Cloud; COMMUNITY / ALL are allowed without one.
    cloud_type: Literal["SECURE", "COMMUNITY", "ALL"] = Field(default="SECURE", description=(
        "Secure Cloud, Community Cloud, or both (network volumes need Secure)"))
    network_volume_id: str = Field(default="", max_length=64, pattern=r"^([a-z0-9]{4,64})?$", description=(
        "Filled from the storage connection when it is a RunPod volume; leave empty"))
    datacenter_id: str = Field(default="", max_length=32, pattern=r"^([A-Z]{2,3}-[A-Z]{2,4}-\d+)?$", description=(
        "Filled from the storage connection when it is a RunPod volume; leave empty"))
    container_disk_gb: int = Field(default=40, ge=10, le=1000, description="The pod's container disk in GB (wiped on stop)")
    # Pod volume at /workspace when there is no network volume: it survives a stop, so a
    # retained pod keeps /workspace/data/adapter.zip (the container disk is wiped on stop).
    volume_gb: int = Field(default=50, ge=10, le=4000, description=(
        "The pod's own volume at /workspace in GB, when there is no network volume (kept on stop)"))

    @model_validator(mode="after")
    def _volume(self) -> RunPodConfig:
        if not self.api_key.get_secret_value().strip():
            raise ValueError("api_key is required: paste the RunPod API key")
        if bool(self.network_volume_id) != bool(self.datacenter_id):
            raise ValueError("network_volume_id and datacenter_id go together (the volume's datacenter)")
        if self.network_volume_id and self.cloud_type != "SECURE":
            raise ValueError("network volumes exist only in Secure Cloud: use cloud_type SECURE")
        return self


def with_storage(config: BaseModel, storage: BaseModel | None) -> BaseModel:
    """The registry's prepare_config hook: pods pin to the org's network volume when the storage
    connection is one (its volume id and datacenter); otherwise the config as saved."""
    if not isinstance(config, RunPodConfig) or not isinstance(storage, RunPodVolumeConfig):
        return config
    return config.model_copy(update={"network_volume_id": storage.volume_id, "datacenter_id": storage.datacenter_id})
