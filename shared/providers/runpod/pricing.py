"""RunPod prices: GPU prices come with the gpuTypes answer (catalog.py); disk is a list price."""

from __future__ import annotations

# RunPod list prices (USD per GB-month): container disk and running pod volume.
DISK_GB_MONTH = 0.10
HOURS_PER_MONTH = 730.0


def disk_per_hour(disk_gb: int) -> float:
    return round(disk_gb * DISK_GB_MONTH / HOURS_PER_MONTH, 4)
