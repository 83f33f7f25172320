"""StorageBackend.open_range in every backend (a download carried on in a later invocation reads from an
offset): local seeks, S3 and the RunPod volume's S3 API answer a Range GET (moto in server mode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.org_storage.base import ObjectMissing, merged_key
from shared.org_storage.config import LocalStorageConfig
from shared.org_storage.local import LocalStorage
from shared.org_storage.runpod_volume import RunPodVolumeStorage
from tests.storage.test_runpod_volume import config as volume_config
from tests.storage.test_s3_storage import storage as s3_storage

DATA = bytes(range(256)) * 40  # 10,240 bytes, each offset telling


@pytest.fixture(params=["local", "s3", "runpod_volume"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "local":
        return LocalStorage(LocalStorageConfig(), tmp_path)
    url = request.getfixturevalue("module_s3_url")
    return s3_storage(url) if request.param == "s3" else RunPodVolumeStorage(volume_config(), endpoint=url)


def read_all(src: Any) -> bytes:
    out = b""
    with src:
        while chunk := src.read(4096):
            out += chunk
    return out


def test_open_range_reads_from_an_offset_and_says_the_whole_size(backend: Any) -> None:
    key = merged_key("run-range")
    backend.put(key, DATA)
    for start in (0, 1, 4097, len(DATA) - 1, len(DATA), len(DATA) + 5):
        src, size = backend.open_range(key, start, len(DATA))
        assert size == len(DATA) and read_all(src) == DATA[start:], start
    with pytest.raises(ValueError, match="more than"):
        backend.open_range(key, 0, len(DATA) - 1)
    backend.delete(key)
    with pytest.raises(ObjectMissing):
        backend.open_range(key, 0, len(DATA))
