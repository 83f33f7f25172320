"""Where the agent reads the dataset and writes the adapter and logs: a directory or presigned URLs.

DirStorage is local storage or a mounted RunPod network volume (keys under a root);
UrlStorage GETs and PUTs presigned URLs. Both write through a temporary file, so a
reader never sees half a file.
"""

from __future__ import annotations

import os
import shutil
import urllib.request
from collections.abc import Callable
from pathlib import Path

from machine.agent.transport import with_retries


class DirStorage:
    """A directory: local storage or a mounted RunPod network volume."""

    def __init__(self, root: str) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not str(path).startswith(str(self.root) + os.sep):
            raise ValueError(f"storage key {key!r} escapes the storage directory")
        return path

    def fetch(self, key: str, dest: Path) -> None:
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.copyfile(self._path(key), tmp)
        tmp.replace(dest)

    def upload(self, key: str, src: Path) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        shutil.copyfile(src, tmp)
        tmp.replace(path)  # readers never see half an adapter


class UrlStorage:
    """Presigned URLs: GET the dataset, PUT the adapter and logs."""

    def __init__(self, log: Callable[[str], None], retry_s: float = 300.0) -> None:
        self.log = log
        self.retry_s = retry_s

    def fetch(self, url: str, dest: Path) -> None:
        tmp = dest.with_name(dest.name + ".tmp")

        def get() -> None:
            with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as f:
                shutil.copyfileobj(response, f, 1024 * 1024)

        with_retries(get, give_up_after_s=self.retry_s, log=self.log, what="dataset download")
        tmp.replace(dest)

    def upload(self, url: str, src: Path) -> None:
        def put() -> None:
            with open(src, "rb") as f:
                request = urllib.request.Request(url, data=f, method="PUT", headers={
                    "Content-Length": str(src.stat().st_size),
                    "Content-Type": "application/octet-stream",
                })
                with urllib.request.urlopen(request, timeout=300) as response:
                    response.read()

        with_retries(put, give_up_after_s=self.retry_s, log=self.log, what=f"upload of {src.name}")
