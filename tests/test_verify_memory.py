"""The verify-adapter step never holds the archive whole: it is copied from storage to a temporary
file in chunks (steps/verify_spool.fetch) and the verifier streams it (its own bound is measured in
tests/test_security_verify.py), so a 1 GiB adapter costs a few MiB of a 4096 MB instance, not 1 GiB."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

from shared.org_storage.config import LocalStorageConfig
from shared.org_storage.local import LocalStorage
from shared.services.steps.verify_spool import CHUNK, Spooled, fetch


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
        spooled = fetch(storage, "runs/r1/adapter.zip", tmp_path / "adapter.part", size, "the adapter archive")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(spooled, Spooled)
    with spooled.path.open("rb") as archive:
        assert archive.read(16) == path.read_bytes()[:16]
    assert (spooled.sha256, spooled.size) == (digest.hexdigest(), size)
    print(f"\nspooled {size >> 20} MiB with a peak Python allocation of {peak / 2**20:.1f} MiB")
    assert peak < 4 * CHUNK  # held whole, it would be 48 MiB
