"""The verify-adapter step never holds the archive whole: it is copied from storage to a temporary
file in chunks (steps/verify_adapter.spool) and the verifier streams it (its own bound is measured in
tests/test_security_verify.py), so a 1 GiB adapter costs a few MiB of a 4096 MB instance, not 1 GiB."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

from shared.org_storage.config import LocalStorageConfig
from shared.org_storage.local import LocalStorage
from shared.services.steps.verify_adapter import SPOOL_CHUNK, spool


def test_the_archive_is_spooled_to_disk_in_chunks(tmp_path: Path) -> None:
    storage = LocalStorage(LocalStorageConfig(), tmp_path)
    size = 48 * 2**20
    path = tmp_path / "runs" / "r1" / "adapter.zip"
    path.parent.mkdir(parents=True)
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for _ in range(size // 2**20):
            chunk = os.urandom(2**20)
            digest.update(chunk)
            f.write(chunk)
    tracemalloc.start()
    try:
        archive, sha256, got = spool(storage, "runs/r1/adapter.zip")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    with archive:
        assert archive.read(16) == path.read_bytes()[:16]
    assert (sha256, got) == (digest.hexdigest(), size)
    print(f"\nspooled {size >> 20} MiB with a peak Python allocation of {peak / 2**20:.1f} MiB")
    assert peak < 4 * SPOOL_CHUNK  # held whole, it would be 48 MiB
