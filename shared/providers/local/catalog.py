"""The local provider's one offer: a process on the control plane's host (no GPU, no price
unless the connection sets one). There is no pricing.py: nothing bills."""

from __future__ import annotations

from shared.models import GpuOffer
from shared.providers.local.config import LocalConfig

PROVIDER = "local"
OFFER_ID = "local-smoke"  # the id stays for saved drafts; the offer trains for real (on the CPU)


def offers(config: LocalConfig) -> list[GpuOffer]:
    price = config.price_per_hour
    return [GpuOffer(provider=PROVIDER, offer_id=OFFER_ID, gpu="none (local CPU)", gpu_memory_gb=0,
                     machine_type="local-process", region="local", compute_per_hour=price,
                     disk_per_hour=0.0, total_per_hour=price,
                     note="a local process on the control plane's host: trains small models (up to 1B "
                          "parameters) on its CPU")]
