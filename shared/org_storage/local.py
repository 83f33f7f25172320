"""Local-directory storage for running without a cloud (and for tests).

The directory is always the one make_storage builds, <TENSORANT_LOCAL_ROOT>/storage/<org>;
a saved config cannot name another (shared/org_storage/config.py refuses `directory`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import BinaryIO

from shared.models import Check, CheckStatus
from shared.org_storage.base import STREAM_CHUNK, ObjectMissing, Readable, adapter_key, checkpoint_key, logs_key, merged_key
from shared.org_storage.config import LocalStorageConfig


class LocalStorage:
    kind = "local"

    def __init__(self, config: LocalStorageConfig, root: Path) -> None:
        self.config = config
        self.root = root.resolve()

    def location(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not str(path).startswith(str(self.root) + os.sep):
            raise ValueError(f"key {key!r} escapes the storage directory")
        return path

    def validate(self) -> list[Check]:
        key = ".tensorant-probe"
        try:
            self.put(key, b"probe")
            write = Check(name="write", status=CheckStatus.ok,
                          message="wrote a probe file in the organization's local storage directory")
        except OSError:
            # No errno text and no path: the message is shown to the org's owner.
            return [Check(name="write", status=CheckStatus.fail, message=(
                "cannot write in the organization's local storage directory; the operator checks that "
                "TENSORANT_LOCAL_ROOT is a directory the control plane can write"))]
        ok = self.get(key, 100) == b"probe"
        read = Check(name="read", status=CheckStatus.ok if ok else CheckStatus.fail,
                     message="read the probe back" if ok else "the probe read back differently")
        self.delete(key)
        gone = not self._path(key).exists()
        delete = Check(name="delete", status=CheckStatus.ok if gone else CheckStatus.fail,
                       message="deleted the probe" if gone else "the probe is still there after delete")
        return [write, read, delete]

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # readers never see half a file

    def put_stream(self, key: str, stream: Readable) -> int:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            with open(tmp, "wb") as f:
                shutil.copyfileobj(stream, f, STREAM_CHUNK)
                size = f.tell()
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(path)
        return size

    def open_stream(self, key: str, max_bytes: int) -> BinaryIO:
        path = self._path(key)
        try:
            size = path.stat().st_size
        except FileNotFoundError as exc:
            raise ObjectMissing(key) from exc
        if size > max_bytes:
            raise ValueError(f"{key} is {size} bytes, more than the {max_bytes} allowed")
        return open(path, "rb")

    def open_range(self, key: str, start: int, max_bytes: int) -> tuple[BinaryIO, int]:
        path = self._path(key)
        try:
            size = path.stat().st_size
        except FileNotFoundError as exc:
            raise ObjectMissing(key) from exc
        if size > max_bytes:
            raise ValueError(f"{key} is {size} bytes, more than the {max_bytes} allowed")
        f = open(path, "rb")  # noqa: SIM115  (the caller closes it)
        f.seek(min(max(0, start), size))
        return f, size

    def upload_url(self, key: str, ttl_s: int) -> str | None:
        return None  # a directory on the control plane's host: uploads go through the API

    def get(self, key: str, max_bytes: int) -> bytes:
        with self.open_stream(key, max_bytes) as f:
            return f.read()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> int:
        if not prefix.endswith("/"):
            raise ValueError(f"a prefix to delete must end with '/', not {prefix!r}")
        folder = self._path(prefix.rstrip("/"))
        if not folder.is_dir():
            return 0
        count = sum(1 for p in folder.rglob("*") if p.is_file() or p.is_symlink())
        shutil.rmtree(folder, ignore_errors=True)
        return count

    def download_url(self, key: str, ttl_s: int) -> str | None:
        return None  # a directory has no URLs: GET /api/runs/{id}/adapter streams the file

    def agent_env(self, run_id: str, dataset: str, *, ttl_s: int | None = None,
                  merged: bool = False, checkpoints: int = 0,
                  validation: str = "") -> tuple[dict[str, str], frozenset[str]]:
        env = {
            "TENSORANT_STORAGE_DIR": str(self.root),
            "TENSORANT_DATASET_KEY": dataset,
            "TENSORANT_ADAPTER_KEY": adapter_key(run_id),
            "TENSORANT_LOGS_KEY": logs_key(run_id),
        }
        if merged:
            env["TENSORANT_MERGED_KEY"] = merged_key(run_id)
        if validation:
            env["TENSORANT_EVAL_DATASET_KEY"] = validation
        if checkpoints:
            env["TENSORANT_CHECKPOINT_KEYS"] = json.dumps([checkpoint_key(run_id, i) for i in range(checkpoints)])
        return env, frozenset()
