"""The agent's transfers: the dataset down; the adapter, checkpoint adapters and logs up.

The adapter is zipped from the trainer's output directory, which the trainer (another user,
the customer's code) owns: only regular, unlinked files go into an archive (open_regular).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from shared.agent.config import AgentConfig
from shared.agent.state import Failed
from shared.agent.storage import DirStorage, UrlStorage
from shared.agent.transport import describe_error

CHECKPOINT_ARCHIVE = "checkpoint-adapter.zip"  # adapter.zip on the disk stays the final adapter's name
# What of a checkpoint is uploaded: the adapter and its manifest; the optimizer state stays on the disk.
CHECKPOINT_EXPORT = ("adapter_config.json", "adapter_model.safetensors", "manifest.json")


def open_regular(path: Path) -> BinaryIO | None:
    """The file opened for reading only if it is a regular file and not a link, checked on the open
    descriptor: the trainer (another user, the customer's code) owns the output directory and could
    swap a checked file for a link (symbolic or hard) to the agent's state file, which holds the run
    token, or for a FIFO that would block the export."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # a hard link could name the state file too
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def zip_folder(folder: Path, final: Path, names: tuple[str, ...] | None = None) -> None:
    """folder's regular files (or only `names` of them) zipped to final, through a temporary file."""
    tmp = final.with_name(final.name + ".tmp")
    final.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(tmp, "w", allowZip64=True) as zf:
        for path in sorted(folder.rglob("*")):
            if names is not None and path.relative_to(folder).as_posix() not in names:
                continue
            if path.is_symlink() or not path.is_file():
                continue  # links and special files never go into the archive
            src = open_regular(path)
            if src is None:
                continue  # swapped for a link or a special file since the check: skipped too
            info = zipfile.ZipInfo(path.relative_to(folder).as_posix(),
                                   time.localtime(os.fstat(src.fileno()).st_mtime)[:6])
            info.compress_type = zipfile.ZIP_STORED if path.suffix == ".safetensors" else zipfile.ZIP_DEFLATED
            with src, zf.open(info, "w", force_zip64=True) as dst:
                shutil.copyfileobj(src, dst, 1024 * 1024)
    tmp.replace(final)


def write_manifest(output: Path, base_model: str) -> None:
    """A trainer that writes no manifest gets one describing what it wrote."""
    files = {p.relative_to(output).as_posix(): {"sha256": file_sha256(p), "size": p.stat().st_size}
             for p in sorted(output.rglob("*")) if p.is_file() and not p.is_symlink()}
    manifest = {"format": 1, "base_model": base_model, "rows": None,
                "trainer": "unknown (manifest written by the agent)", "files": files}
    (output / "manifest.json").write_text(json.dumps(manifest, indent=2))


class Uploads:
    """The run's storage, reached through a directory or presigned URLs, and what goes through it."""

    def __init__(self, config: AgentConfig, log: Callable[[str], None], *, output: Path, logs_path: Path) -> None:
        self.config = config
        self.log = log
        self.data_dir = config.data_dir
        self.output = output  # the trainer's output directory: the final adapter
        self.logs_path = logs_path

    def storage(self) -> DirStorage | UrlStorage:
        if self.config.storage_dir:
            return DirStorage(self.config.storage_dir)
        if self.config.dataset_url:
            return UrlStorage(self.log)
        raise Failed("the agent has no storage access (neither TENSORANT_STORAGE_DIR nor TENSORANT_DATASET_URL)")

    def fetch_dataset(self) -> Path:
        dest = self.data_dir / "dataset.jsonl"
        storage = self.storage()
        source = self.config.dataset_key if isinstance(storage, DirStorage) else self.config.dataset_url
        try:
            storage.fetch(source, dest)
        except Exception as exc:
            raise Failed(f"could not download the dataset: {describe_error(exc)}", output_exists=False,
                         stage="dataset") from exc
        if self.config.dataset_sha256:
            got = file_sha256(dest)
            if got != self.config.dataset_sha256:
                raise Failed(f"the downloaded dataset is not the validated one (sha256 {got}, validated "
                             f"{self.config.dataset_sha256}): it changed in storage; upload a new version",
                             output_exists=False, stage="dataset")
        self.log(f"dataset downloaded ({dest.stat().st_size} bytes)")
        return dest

    def archive_path(self) -> Path:
        """Where adapter.zip is kept on the machine (the product docs' recovery paths): with RunPod
        network storage reached through its S3 API (presigned URLs plus the volume's keys, i.e. an
        AWS or Azure host) it is DATA_DIR/runs/<RUN_ID>/adapter.zip, the volume's own layout;
        otherwise DATA_DIR/adapter.zip."""
        key = self.config.adapter_key
        if key and not self.config.storage_dir and self.config.adapter_upload_url:
            path = (self.data_dir / key).resolve()
            if str(path).startswith(str(self.data_dir.resolve()) + os.sep):
                return path
        return self.data_dir / "adapter.zip"

    def output_exists(self) -> bool:
        """Whether the machine holds anything worth recovering: a file the trainer wrote, an archive."""
        if self.archive_path().is_file():
            return True
        return self.output.is_dir() and any(p.is_file() for p in self.output.rglob("*"))

    def export(self) -> tuple[str, int]:
        """Zip the output directory to the archive path and upload it; returns (sha256, size)."""
        output = self.output
        if not (output / "manifest.json").exists():
            write_manifest(output, self.config.base_model)
        final = self.archive_path()
        try:
            zip_folder(output, final)
        except OSError as exc:
            raise Failed(f"could not write adapter.zip: {describe_error(exc)}", output_exists=True,
                         stage="export") from exc
        sha256, size = file_sha256(final), final.stat().st_size
        storage = self.storage()
        target = self.config.adapter_key if isinstance(storage, DirStorage) else self.config.adapter_upload_url
        try:
            storage.upload(target, final)
        except Exception as exc:
            raise Failed(f"could not upload adapter.zip: {describe_error(exc)}; it is kept on the machine at "
                         f"{final}", output_exists=True, stage="upload") from exc
        self.log(f"adapter uploaded ({size} bytes, sha256 {sha256})")
        return sha256, size

    def upload_checkpoint(self, folder: Path) -> None:
        """Upload a checkpoint folder's adapter as the run's adapter archive. Best effort: a
        failure only means storage keeps an older checkpoint; training goes on."""
        archive = self.data_dir / CHECKPOINT_ARCHIVE
        try:
            zip_folder(folder, archive, CHECKPOINT_EXPORT)
            with zipfile.ZipFile(archive) as zf:
                if sorted(zf.namelist()) != sorted(CHECKPOINT_EXPORT):
                    # The trainer replaced this checkpoint while it was read: the next one is uploaded.
                    raise OSError(f"{folder.name} changed while it was archived")
            storage = self.storage()
            target = self.config.adapter_key if isinstance(storage, DirStorage) else self.config.adapter_upload_url
            storage.upload(target, archive)
        except Exception as exc:
            self.log(f"could not upload the checkpoint's adapter: {describe_error(exc)}")
            return
        self.log(f"checkpoint adapter uploaded ({folder.name}, {archive.stat().st_size} bytes)")

    def upload_logs(self) -> None:
        try:
            storage = self.storage()
            target = self.config.logs_key if isinstance(storage, DirStorage) else self.config.logs_upload_url
            if target and self.logs_path.exists():
                storage.upload(target, self.logs_path)
        except Exception as exc:
            # Logs are a convenience; their loss must not fail the run.
            self.log(f"could not upload logs: {describe_error(exc)}")
