"""The verify step's downloads, bounded in time: an archive is copied from storage into a spool file in
chunks while the invocation's budget (shared/budget.py) allows, and the step carries on in its next
invocation where the transfer is longer (a 3 GiB merged model at 10 MB/s is about 320 s, four budgets).

Where the bytes live: a spool is a file of this instance's temporary directory, under the run's id
(<tmp>/tensorant-verify/<run_id>/<artifact>.part). A continuation delivered to the same instance appends
to it from its size, by a ranged read of storage (StorageBackend.open_range); one delivered to another
instance has no spool there and starts its own from byte 0, while the first instance keeps its own, so a
later continuation that lands back on it carries on where it was. So each instance transfers each byte at
most once, and a transfer spread over N instances costs at most N transfers. Re-fetching only the rest
on another instance would need the sha256 state of the bytes before, which hashlib cannot export, and
the verifier needs the whole archive as one local file anyway.

The sha256 of a spool is kept in this process's memory with the offset it covers; a new process (a
restarted worker) re-hashes the spool from local disk, which costs no storage transfer. The run's
verify_progress records how far the transfer got (for the run's view, and so that two continuations
of one run, a message delivered twice, do not both carry on: see verify_adapter.carry_on). An exclusive
lock on the spool's directory keeps two invocations on one instance from appending at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from shared.budget import remaining

CHUNK = 1024 * 1024
# What a download leaves of the invocation's budget: the verification of the spooled archives (local
# disk, a few seconds for the largest) and the store writes around it.
RESERVE_S = 15.0
# A spool nobody touched for this long is an abandoned one (its run ended on another instance, or
# the instance restarted mid-transfer): the next verification on this instance deletes it.
STALE_S = 6 * 3600.0
_hashes: dict[str, tuple[int, Any]] = {}  # spool path -> (bytes hashed, the sha256 object)


def host() -> str:
    """This instance's name: Azure's WEBSITE_INSTANCE_ID, else the host name."""
    return os.environ.get("WEBSITE_INSTANCE_ID") or socket.gethostname()


def root() -> Path:
    return Path(tempfile.gettempdir()) / "tensorant-verify"


def spool_dir(run_id: str) -> Path:
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise ValueError(f"run id {run_id!r} cannot name a spool directory")
    return root() / run_id


@dataclass(frozen=True)
class Spooled:
    """An archive whole in a local file."""

    path: Path
    sha256: str
    size: int


@dataclass(frozen=True)
class Partial:
    """A transfer the budget cut: `offset` of `size` bytes are in this instance's spool."""

    offset: int
    size: int


@contextlib.contextmanager
def locked(run_id: str) -> Iterator[bool]:
    """This instance's exclusive hold on the run's spools: yields False when another invocation holds it
    (it carries the transfer on and sends the next message itself)."""
    folder = spool_dir(run_id)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _hash_of(path: Path, offset: int) -> Any:
    known = _hashes.get(str(path))
    if known is not None and known[0] == offset:
        return known[1]
    digest = hashlib.sha256()  # a new process: the spool's bytes hashed again from local disk
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest


def fetch(storage: Any, key: str, path: Path, max_bytes: int, what: str,
          reserve_s: float | None = None) -> Spooled | Partial:
    """Append the object at `key` to the spool at `path` from the spool's size on, until it is whole
    (Spooled) or the invocation's budget comes within `reserve_s` of its end (Partial). ObjectMissing
    when absent; ValueError when larger than max_bytes."""
    reserve_s = RESERVE_S if reserve_s is None else reserve_s
    offset = path.stat().st_size if path.exists() else 0
    src, size = storage.open_range(key, offset, max_bytes)
    if offset > size:  # the object was replaced by a smaller one: this spool is of another object
        src.close()
        offset = 0
        path.unlink(missing_ok=True)
        src, size = storage.open_range(key, 0, max_bytes)
    with src:
        digest = _hash_of(path, offset) if offset else hashlib.sha256()
        with open(path, "ab") as out:
            while offset < size:
                if remaining() <= reserve_s:
                    break
                chunk = src.read(min(CHUNK, size - offset))
                if not chunk:
                    raise ValueError(f"{what} ended at byte {offset} of the {size} storage declared")
                out.write(chunk)
                digest.update(chunk)
                offset += len(chunk)
            out.flush()
            os.fsync(out.fileno())  # the spool's size is the offset a later invocation resumes from
    _hashes[str(path)] = (offset, digest)
    if offset < size:
        return Partial(offset, size)
    if offset > max_bytes:
        raise ValueError(f"{what} is larger than {max_bytes} bytes")
    return Spooled(path, digest.hexdigest(), size)


def open_spooled(spooled: Spooled) -> BinaryIO:
    return open(spooled.path, "rb")


def discard(run_id: str) -> None:
    """This instance's spools of the run, deleted (the run's verification ended), and any abandoned one."""
    folder = spool_dir(run_id)
    for path in folder.glob("*.part"):
        _hashes.pop(str(path), None)
    shutil.rmtree(folder, ignore_errors=True)
    sweep_stale()


def sweep_stale(now: float | None = None) -> int:
    """Delete spool directories untouched for STALE_S (wall time: file times are the host's)."""
    now = time.time() if now is None else now
    gone = 0
    with contextlib.suppress(OSError):
        for folder in root().iterdir():
            with contextlib.suppress(OSError):
                if folder.is_dir() and now - max(p.stat().st_mtime for p in [folder, *folder.iterdir()]) > STALE_S:
                    shutil.rmtree(folder, ignore_errors=True)
                    gone += 1
    return gone
