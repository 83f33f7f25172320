"""A full disk under the local storage answers a dataset upload 507 with what to do, and keeps nothing
half-written. The full disk is real: a 64 KiB tmpfs mounted over the storage folder
(root only; skipped where mounting is not allowed)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Harness


@pytest.fixture
def full_disk(env: dict[str, str]) -> Iterator[Path]:
    storage = Path(env["TENSORANT_LOCAL_ROOT"]) / "storage"
    storage.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(storage)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield storage
    finally:
        subprocess.run(["umount", str(storage)], check=True)


def test_a_dataset_upload_to_a_full_disk_is_507_and_keeps_nothing(full_disk: Path) -> None:
    h = Harness()
    try:
        h.save_storage({"kind": "local"})
        project = h.ok("POST", "/api/projects", json_body={"name": "full"})
        small = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
        kept = h.ok("POST", f"/api/projects/{project['id']}/datasets", body=small.encode(),
                    content_type="application/x-ndjson")
        big = "\n".join(json.dumps({"messages": [{"role": "user", "content": "q" * 900},
                                                 {"role": "assistant", "content": f"a{i}"}]}) for i in range(200))
        status, body, _ = h.call("POST", f"/api/projects/{project['id']}/datasets", body=big.encode(),
                                 content_type="application/x-ndjson")
        assert status == 507 and "storage is full" in body["detail"] and "nothing" in body["detail"], body
        files = [p for p in full_disk.rglob("*") if p.is_file()]
        assert len(files) == 1 and files[0].suffix == ".jsonl", files  # the first dataset only, no partial file
        listed = h.ok("GET", f"/api/projects/{project['id']}/datasets")["items"]
        assert [d["id"] for d in listed] == [kept["id"]]  # the refused upload left no record either
    finally:
        h.close()
