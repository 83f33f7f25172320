"""What the RunPod adapter's tests share besides the `fake` server fixture (conftest.py): the
account's key, one run's name and launch spec, and a RunPodCompute built on that key."""

from __future__ import annotations

from pydantic import SecretStr

from shared.models import GpuOffer
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from shared.providers.runpod.compute import RunPodCompute
from shared.providers.runpod.config import RunPodConfig
from shared.settings import Settings

KEY = "rpa_TESTKEY0123456789"
REF = RunRef(deployment="test", org="org1", run_id="run-abc")


def provider(key: str = KEY, network_volume_id: str = "", datacenter_id: str = "") -> RunPodCompute:
    config = RunPodConfig(api_key=SecretStr(key), network_volume_id=network_volume_id, datacenter_id=datacenter_id)
    return RunPodCompute(config, Settings(deployment_id="test"))


def spec(gpu: str = "NVIDIA A40", env: dict[str, str] | None = None, ref: RunRef = REF) -> LaunchSpec:
    offer = GpuOffer(provider="runpod", offer_id="x", gpu=gpu, gpu_memory_gb=48, machine_type=gpu, region="any",
                     compute_per_hour=0.4, disk_per_hour=0.01, total_per_hour=0.41)
    env = env if env is not None else {"TENSORANT_RUN_ID": ref.run_id, "TENSORANT_RUN_TOKEN": "tok-secret-123"}
    boot = Bootstrap(container_image="ghcr.io/tensorant/trainer:2026.11", env=env,
                     secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"}))
    return LaunchSpec(ref=ref, offer=offer, bootstrap=boot)
