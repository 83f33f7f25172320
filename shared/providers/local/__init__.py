"""The `local` compute provider: each run's "machine" is an agent process on this host."""

from __future__ import annotations

from pydantic import BaseModel

from shared.providers.base import ComputeProvider
from shared.providers.local.config import LocalConfig
from shared.providers.registry import CpuTraining, ProviderInfo
from shared.settings import Settings


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    from shared.providers.local import compute  # the lifecycle module: only when a step needs it

    return compute.build(config, settings)


def model_source(base_model: str) -> tuple[str, str]:
    from shared.providers.local import models  # imports the trainer (machine/): only when asked

    return models.source(base_model)


# The machine is the developer's own host: it exists only outside production, it trains on the host's CPU
# (the trainer builds the test models itself and loads others from the host's cache, without the hub), and the
# smoke trainer's adapter (no training, for a machine without a GPU) may pass verification there.
PROVIDER = ProviderInfo("local", LocalConfig, build, {"price_per_hour": 0.0}, dev_only=True, smoke_trainer_allowed=True,
                        resumes_training=True, model_source=model_source, trains_on_cpu=CpuTraining(),
                        builds_test_models=True, retired_fields={
                            "trainer_command": "the trainer command is an operator setting (TENSORANT_TRAINER_COMMAND), "
                                               "not part of a connection; remove the field"})
