"""An exclusive lock on a file, held across processes (the local provider's launches, and the
trainer's model cache: queue messages and runs may race each other on one host). It lives in
machine/trainer so the training image, which holds only machine/agent, machine/trainer and
adapter_format, has it; the local provider imports it from here."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
