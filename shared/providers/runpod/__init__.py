"""RunPod compute: one pod per run, named `tensorant-<deployment>-<run id>` (RunPod has no tags).
This module and `config` import no SDK."""

from __future__ import annotations

from pydantic import BaseModel

from shared.providers.base import ComputeProvider
from shared.providers.lazy import modules_of
from shared.providers.registry import ProviderInfo
from shared.providers.runpod import sdk
from shared.providers.runpod.config import RunPodConfig, with_storage
from shared.settings import Settings


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    from shared.providers.runpod import compute  # the lifecycle module: only when a step needs RunPod

    return compute.build(config, settings)


PROVIDER = ProviderInfo("runpod", RunPodConfig, build, {"api_key": "<RunPod API key>", "cloud_type": "SECURE"},
                        sdk_modules=modules_of(sdk), prepare_config=with_storage, resumes_training=True,
                        working_files_on_storage=True, lists_network_volumes=True, title="RunPod")
