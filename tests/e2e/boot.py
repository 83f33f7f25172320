"""What the bootstrap e2e tests share (tests/e2e/test_bootstrap_e2e.py, test_image_e2e.py): a
Harness on the simulated clock the machine's `sleep` shim moves, with custom S3 storage on moto, and
the wait for a run to end while the machine plays its part. Their fixtures (`plane`, `boot_aws_h`)
are in tests/e2e/conftest.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared import clock
from tests.harness import Harness
from tests.machine import LedgerClock, Machine, wait_for

BUCKET = "tensorant-boot"
END = {"succeeded", "failed", "cancelled", "retained"}


class BootHarness(Harness):
    """A Harness whose simulated clock also moves by what the machine's `sleep` shim was asked for."""

    clock: LedgerClock

    def __init__(self, ledger: Path) -> None:
        super().__init__()
        self.clock = LedgerClock(self.clock.t, ledger)
        clock.set_clock(self.clock)


RUNPOD_KEY = "rpa_BOOTKEY0123456789"  # the fake RunPod server's key in the boot fixtures (tests/e2e/conftest.py)


def boot_harness(tmp_path: Path, moto: str) -> BootHarness:
    """A BootHarness whose org stores its data on custom S3 (moto), as a customer's machine reaches it."""
    import boto3

    h = BootHarness(tmp_path / "slept")
    s3 = boto3.client("s3", endpoint_url=moto, region_name="us-east-1", aws_access_key_id="AKIAROOT0000",
                      aws_secret_access_key="x" * 40)
    try:
        s3.create_bucket(Bucket=BUCKET)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    storage = h.save_storage({"kind": "s3", "endpoint": moto, "region": "us-east-1", "bucket": BUCKET,
                              "prefix": "org-a", "access_key_id": "AKIABOOTTEST0001",
                              "secret_access_key": "boot-secret-0123456789abcdefghij"})
    assert storage["status"] == "connected", storage["checks"]
    return h


def finish(harness: Harness, run_id: str, machine: Machine | None, timeout: float = 120) -> dict[str, Any]:
    """Drive the queues until the run ends; then the machine is powered off (the cloud deleted it)."""
    def ended() -> Any:
        run = harness.get_run(run_id)
        return run if run["state"] in END else None

    try:
        run: dict[str, Any] = wait_for(ended, f"run {run_id} to end", timeout, machine=machine, between=harness.drain)
    finally:
        if machine is not None:
            machine.power_off()
    return run
