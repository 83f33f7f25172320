"""Azure compute provider, one module per role: config (what a user saves, no SDK), client (the one
door to the SDK), errors, catalog, pricing, checks, compute (lifecycle). This module imports no SDK."""

from __future__ import annotations

from pydantic import BaseModel

from shared.providers.azure import sdk
from shared.providers.azure.config import AzureConfig
from shared.providers.base import ComputeProvider
from shared.providers.lazy import modules_of
from shared.providers.registry import ProviderInfo
from shared.settings import Settings


def build(config: BaseModel, settings: Settings) -> ComputeProvider:
    from shared.providers.azure import compute  # the lifecycle module: only when a step needs Azure

    return compute.build(config, settings)


_SUB = "/subscriptions/00000000-0000-4000-8000-000000000003/resourceGroups/tensorant-training/providers"
EXAMPLE = {
    "tenant_id": "00000000-0000-4000-8000-000000000001", "client_id": "00000000-0000-4000-8000-000000000002",
    "client_secret": "<the client secret's Value>", "subscription_id": "00000000-0000-4000-8000-000000000003",
    "resource_group": "tensorant-training", "region": "eastus",
    "subnet_id": f"{_SUB}/Microsoft.Network/virtualNetworks/training/subnets/default",
    "image_id": f"{_SUB}/Microsoft.Compute/images/tensorant-trainer",
    "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8g trainer",
}

PROVIDER = ProviderInfo("azure", AzureConfig, build, EXAMPLE,
                        sdk_modules=modules_of(sdk),
                        resumes_training=True)
