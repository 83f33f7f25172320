"""The chaos cloud for several processes: one account in a JSON file that every host shares.

Hand-written like ChaosCloud (no emulator exists for "a cloud"), and the same object: the
chaos provider, the agents and the invariant checks use it unchanged. Only its `lock`
differs: entering it takes an exclusive flock on the file (and a thread lock), loads the
account, and leaving it writes the account back atomically (temp file + rename). A process
that dies inside holds nothing: the kernel drops its flock, and the file keeps the last
complete write.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import threading
from collections import Counter
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.chaos.provider import ChaosCloud
from tests.fakes import Machine


class _FileLock:
    def __init__(self, cloud: FileCloud) -> None:
        self.cloud = cloud
        self.thread_lock = threading.RLock()
        self.depth = 0
        self.fd = -1

    def __enter__(self) -> _FileLock:
        self.thread_lock.acquire()
        if self.depth == 0:
            self.fd = os.open(self.cloud.lock_path, os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.cloud.load()
        self.depth += 1
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.depth -= 1
        try:
            if self.depth == 0:
                try:
                    self.cloud.save()
                finally:
                    os.close(self.fd)  # drops the flock
                    self.fd = -1
        finally:
            self.thread_lock.release()


class FileCloud(ChaosCloud):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.lock_path = str(self.path) + ".lock"
        self.lock = _FileLock(self)  # type: ignore[assignment]

    def load(self) -> None:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        self.machines = {m["id"]: Machine(**{**m, "created_at": datetime.fromisoformat(m["created_at"])
                                            if m.get("created_at") else None})
                         for m in data.get("machines", [])}
        self.ids = itertools.count(int(data.get("next_id", 1)))
        self.created = Counter(data.get("created", {}))
        self.visible_at = dict(data.get("visible_at", {}))
        self.invisible_s = float(data.get("invisible_s", self.invisible_s))
        self.calls = []  # per process and per lock; not shared

    def save(self) -> None:
        machines = []
        for m in self.machines.values():
            d = asdict(m)
            d["created_at"] = m.created_at.isoformat() if m.created_at else None
            machines.append(d)
        data = {"machines": machines, "next_id": next(self.ids), "created": dict(self.created),
                "visible_at": self.visible_at, "invisible_s": self.invisible_s}
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)
