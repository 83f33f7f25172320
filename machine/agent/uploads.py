"""The agent's transfers: the dataset down; the adapter, checkpoint adapters, the merged model and logs up.

The adapter is zipped from the trainer's output directory, which the trainer (another user,
the customer's code) owns: only the adapter's own files at its top level go into an archive,
each opened from a descriptor of the folder without following a link (zip_folder).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from machine.agent.config import AgentConfig
from machine.agent.state import Failed
from machine.agent.storage import DirStorage, UrlStorage
from machine.agent.transport import describe_error

CHECKPOINT_ARCHIVE = "checkpoint-adapter.zip"
VALIDATION_FILE = "validation.jsonl"  # beside dataset.jsonl: the trainer's TENSORANT_EVAL_DATASET_PATH
KEPT_FILE = "checkpoints-kept.json"  # which checkpoint is in which storage slot, kept across agent restarts
MAX_SLOTS = 10  # shared.models.MAX_KEEP_CHECKPOINTS  # adapter.zip on the disk stays the final adapter's name
# What an adapter archive holds, and all it may hold (the verifier refuses any other entry): a
# checkpoint's optimizer state stays on the disk, and nothing else the trainer writes is exported.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "manifest.json")
MANIFEST = "manifest.json"
# training.merged: the trainer's output/merged folder (machine.trainer.merge) and the files of it that are
# exported; the verifier refuses any other entry (adapter_format.merged).
MERGED_DIR = "merged"
_MERGED_FILE = re.compile(r"^(config\.json|generation_config\.json|manifest\.json|model\.safetensors(\.index\.json)?"
                          r"|model-\d{5}-of-\d{5}\.safetensors)$")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
# O_NONBLOCK: a FIFO would block the open; O_NOCTTY: a terminal never becomes the agent's.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC


def open_regular(name: str, folder_fd: int) -> BinaryIO | None:
    """folder's file `name` (one component: no "/"), opened for reading only if it is a regular file
    and not a link, checked on the open descriptor: the trainer owns the folder and could swap a
    file for a link (symbolic or hard) to the agent's state file, which holds the run token, or for
    a FIFO that would block the export."""
    if "/" in name or name in ("", ".", ".."):
        return None
    try:
        fd = os.open(name, _FILE, dir_fd=folder_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # a hard link could name the state file too
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _step_of(folder: Path) -> int:
    m = re.fullmatch(r"step-(\d{1,8})", folder.name)
    return int(m.group(1)) if m else 0


def _read_kept(path: Path) -> list[dict[str, object]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    ok = isinstance(data, list) and all(isinstance(k, dict) and isinstance(k.get("step"), int)
                                        and isinstance(k.get("slot"), int) for k in data)
    return data if ok else []


def _write_kept(path: Path, kept: list[dict[str, object]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open_archive(tmp) as f:
        f.write(json.dumps(kept).encode())
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256_of(src: BinaryIO) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := src.read(1024 * 1024):
        digest.update(chunk)
        size += len(chunk)
    src.seek(0)
    return digest.hexdigest(), size


def open_archive(path: Path) -> BinaryIO:
    """path created (or emptied) mode 0600 and opened for writing: an archive may hold what the
    trainer wrote, and nobody but the agent reads it on the machine."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | _CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an earlier attempt keeps its mode otherwise
    return os.fdopen(fd, "wb")


def zip_folder(folder: Path, final: Path, names: tuple[str, ...] = ADAPTER_FILES, *,
               manifest_base_model: str | None = None) -> None:
    """The files `names` at folder's top level zipped to final (mode 0600), through a temporary file.

    folder is opened without following a link at its last component (its parent is the agent's data
    directory or the trainer's checkpoint folder within it, neither of which the trainer can rename),
    and each name from that descriptor, so no link anywhere is followed: the trainer cannot point the
    export at /proc/<agent>/environ or at the agent's state file, even by swapping a folder while it
    runs. Nothing else of the folder is listed or read. Each name must be a regular file with one
    link; otherwise OSError names it. manifest_base_model: a folder without manifest.json gets one
    in the archive describing the other files (the trainer's folder is never written to)."""
    tmp = final.with_name(final.name + ".tmp")
    final.parent.mkdir(parents=True, exist_ok=True)
    folder_fd = os.open(folder, _FOLDER)
    try:
        sources: dict[str, BinaryIO] = {}
        try:
            _open_sources(folder, folder_fd, names, manifest_base_model, sources)
            generated = None
            if MANIFEST in names and MANIFEST not in sources and manifest_base_model is not None:
                generated = _manifest(sources, manifest_base_model)
            _write_zip(tmp, names, sources, generated)
        finally:
            for src in sources.values():
                src.close()
    finally:
        os.close(folder_fd)
    tmp.replace(final)


def _open_sources(folder: Path, folder_fd: int, names: tuple[str, ...], manifest_base_model: str | None,
                  sources: dict[str, BinaryIO]) -> None:
    """Each name opened from the folder's descriptor into `sources` (the caller closes them, also after an
    error); OSError for one missing, a link or not a regular file (an absent manifest that is generated aside)."""
    for name in names:
        src = open_regular(name, folder_fd)
        if src is not None:
            sources[name] = src
        elif not (name == MANIFEST and manifest_base_model is not None
                  and _absent(name, folder_fd)):
            raise OSError(f"{name} in {folder.name} is missing, a link or not a regular file")


def _write_zip(tmp: Path, names: tuple[str, ...], sources: dict[str, BinaryIO], generated: bytes | None) -> None:
    """The opened files (and the generated manifest) zipped to tmp, mode 0600, in the order of names."""
    stamp = time.localtime()[:6]  # not the trainer's mtime: zip refuses one before 1980
    with open_archive(tmp) as out, zipfile.ZipFile(out, "w", allowZip64=True) as zf:
        for name in names:
            data = sources.get(name)
            if data is None and generated is None:
                continue
            info = zipfile.ZipInfo(name, stamp)
            info.external_attr = 0o100644 << 16  # a regular file (the verifier reads the type)
            info.compress_type = zipfile.ZIP_STORED if name.endswith(".safetensors") else zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as dst:
                if data is not None:
                    shutil.copyfileobj(data, dst, 1024 * 1024)
                elif generated is not None:
                    dst.write(generated)


def merged_names(folder: Path) -> tuple[str, ...]:
    """The merged model's file names at folder's top level (listed from a descriptor of the folder, not
    followed through a link; zip_folder opens each the same way)."""
    folder_fd = os.open(folder, _FOLDER)
    try:
        names = os.listdir(folder_fd)
    finally:
        os.close(folder_fd)
    return tuple(sorted(n for n in names if _MERGED_FILE.match(n)))


def _absent(name: str, folder_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    return False


def _manifest(sources: dict[str, BinaryIO], base_model: str) -> bytes:
    """A manifest for a trainer that wrote none, describing the files being exported."""
    files = {}
    for name, src in sorted(sources.items()):
        digest, size = _sha256_of(src)
        files[name] = {"sha256": digest, "size": size}
    manifest = {"format": 1, "base_model": base_model, "rows": None,
                "trainer": "unknown (manifest written by the agent)", "files": files}
    return json.dumps(manifest, indent=2).encode()


class Uploads:
    """The run's storage, reached through a directory or presigned URLs, and what goes through it."""

    def __init__(self, config: AgentConfig, log: Callable[[str], None], *, output: Path, logs_path: Path) -> None:
        self.config = config
        self.log = log
        self.data_dir = config.data_dir
        self.output = output  # the trainer's output directory: the final adapter
        self.logs_path = logs_path
        self.kept: list[dict[str, object]] = _read_kept(self.data_dir / KEPT_FILE)

    def checkpoint_slots(self) -> list[str]:
        """The run's checkpoint slots: keys under the storage directory, or presigned PUT URLs."""
        raw = self.config.checkpoint_keys if self.config.storage_dir else self.config.checkpoint_upload_urls
        try:
            slots = json.loads(raw) if raw else []
        except ValueError:
            return []
        return [str(x) for x in slots][:MAX_SLOTS] if isinstance(slots, list) else []

    def keep_checkpoint(self, archive: Path, step: int, train_loss: float | None, eval_loss: float | None) -> None:
        """Put a checkpoint's archive in the slot of the oldest kept one (or a free slot) and list it for the
        heartbeats. Its entry leaves the list (written to the disk) before the slot is overwritten, so no
        report ever names a slot for a step it may no longer hold."""
        slots = self.checkpoint_slots()
        if not slots:
            return
        used = {int(str(k["slot"])) for k in self.kept}
        free = [i for i in range(len(slots)) if i not in used]
        slot = free[0] if free else int(str(min(self.kept, key=lambda k: int(str(k["step"])))["slot"]))
        self.kept = [k for k in self.kept if k["slot"] != slot and k["step"] != step]
        _write_kept(self.data_dir / KEPT_FILE, self.kept)
        storage = self.storage()
        storage.upload(slots[slot], archive)
        entry: dict[str, object] = {"step": step, "slot": slot, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                        time.gmtime()),
                                    "size": archive.stat().st_size, "sha256": file_sha256(archive)}
        entry.update({k: round(v, 6) for k, v in (("train_loss", train_loss), ("eval_loss", eval_loss))
                      if v is not None and 0 <= v <= 1e6})
        self.kept = sorted([*self.kept, entry], key=lambda k: int(str(k["step"])))
        _write_kept(self.data_dir / KEPT_FILE, self.kept)

    def storage(self) -> DirStorage | UrlStorage:
        if self.config.storage_dir:
            return DirStorage(self.config.storage_dir)
        if self.config.dataset_url:
            return UrlStorage(self.log)
        raise Failed("the agent has no storage access (neither TENSORANT_STORAGE_DIR nor TENSORANT_DATASET_URL)")

    def dataset_path(self) -> Path:
        """The dataset downloaded before a restart (it is on the kept disk), or fetched again if it is gone."""
        dest = self.data_dir / "dataset.jsonl"
        if not dest.is_file():
            return self.fetch_dataset()
        if (self.config.eval_dataset_key or self.config.eval_dataset_url) and not (self.data_dir / VALIDATION_FILE).is_file():
            self.fetch_validation()
        return dest

    def fetch_dataset(self) -> Path:
        dest = self.data_dir / "dataset.jsonl"
        storage = self.storage()
        source = self.config.dataset_key if isinstance(storage, DirStorage) else self.config.dataset_url
        try:
            storage.fetch(source, dest)
        except Exception as exc:
            raise Failed(f"could not download the dataset: {describe_error(exc)}", output_exists=False,
                         stage="dataset") from exc
        self._check_sha(dest, self.config.dataset_sha256, "dataset")
        self.log(f"dataset downloaded ({dest.stat().st_size} bytes)")
        if self.config.eval_dataset_key or self.config.eval_dataset_url:
            self.fetch_validation()
        return dest

    def fetch_validation(self) -> Path:
        """The run's validation dataset (validation_dataset_version_id) beside the dataset, checked like it."""
        dest = self.data_dir / VALIDATION_FILE
        storage = self.storage()
        source = self.config.eval_dataset_key if isinstance(storage, DirStorage) else self.config.eval_dataset_url
        try:
            storage.fetch(source, dest)
        except Exception as exc:
            raise Failed(f"could not download the validation dataset: {describe_error(exc)}", output_exists=False,
                         stage="dataset") from exc
        self._check_sha(dest, self.config.eval_dataset_sha256, "validation dataset")
        self.log(f"validation dataset downloaded ({dest.stat().st_size} bytes)")
        return dest

    def _check_sha(self, dest: Path, expected: str, what: str) -> None:
        if expected:
            got = file_sha256(dest)
            if got != expected:
                raise Failed(f"the downloaded {what} is not the validated one (sha256 {got}, validated "
                             f"{expected}): it changed in storage; upload a new version",
                             output_exists=False, stage="dataset")

    def archive_path(self) -> Path:
        """Where adapter.zip is kept on the machine (the product docs' recovery paths): with RunPod
        network storage reached through its S3 API (presigned URLs plus the volume's keys, i.e. an
        AWS or Azure host) it is DATA_DIR/runs/<RUN_ID>/adapter.zip, the volume's own layout;
        otherwise DATA_DIR/adapter.zip."""
        return self._kept_at(self.config.adapter_key, self.config.adapter_upload_url, "adapter.zip")

    def _kept_at(self, key: str, url: str, name: str) -> Path:
        if key and not self.config.storage_dir and url:
            path = (self.data_dir / key).resolve()
            if str(path).startswith(str(self.data_dir.resolve()) + os.sep):
                return path
        return self.data_dir / name

    def output_exists(self) -> bool:
        """Whether the machine holds anything worth recovering: a file the trainer wrote, an archive."""
        if self.archive_path().is_file():
            return True
        return self.output.is_dir() and any(p.is_file() for p in self.output.rglob("*"))

    def export(self) -> tuple[str, int]:
        """Zip the output directory to the archive path and upload it; returns (sha256, size)."""
        final = self.archive_path()
        try:
            zip_folder(self.output, final, manifest_base_model=self.config.base_model)
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

    def export_merged(self) -> dict[str, str | int]:
        """training.merged (the control plane gave a key or URL for merged.zip): the trainer's output/merged
        zipped and uploaded; the completion's merged_sha256 and merged_size. A trainer that made none, or an
        export that fails, is logged and gives {}: the adapter is the run's product, and the run succeeds
        without the merged model, its reason in the log."""
        if not (self.config.merged_key or self.config.merged_upload_url):
            return {}
        final = self._kept_at(self.config.merged_key, self.config.merged_upload_url, "merged.zip")
        try:
            zip_folder(self.output / MERGED_DIR, final, merged_names(self.output / MERGED_DIR))
            sha256, size = file_sha256(final), final.stat().st_size
            storage = self.storage()
            target = self.config.merged_key if isinstance(storage, DirStorage) else self.config.merged_upload_url
            storage.upload(target, final)
        except FileNotFoundError:
            self.log("the trainer wrote no merged model (its log says why); the adapter is exported without it")
            return {}
        except Exception as exc:
            self.log(f"could not export the merged model: {describe_error(exc)}; the adapter is exported without it")
            return {}
        self.log(f"merged model uploaded ({size} bytes, sha256 {sha256})")
        return {"merged_sha256": sha256, "merged_size": size}

    def upload_checkpoint(self, folder: Path, train_loss: float | None = None,
                          eval_loss: float | None = None, what: str = "") -> None:
        """Upload a checkpoint folder's adapter (or, `what` saying so, the output folder's final adapter
        before the trainer ends) as the run's adapter archive, and a checkpoint into the run's ring of kept
        checkpoints. Best effort: a failure only means storage keeps an older checkpoint; training goes on."""
        archive = self.data_dir / CHECKPOINT_ARCHIVE
        try:
            # A checkpoint the trainer replaces while it is read fails here: the next one is uploaded.
            zip_folder(folder, archive)
            storage = self.storage()
            target = self.config.adapter_key if isinstance(storage, DirStorage) else self.config.adapter_upload_url
            storage.upload(target, archive)
            step = _step_of(folder)
            if step:
                self.keep_checkpoint(archive, step, train_loss, eval_loss)
        except FileNotFoundError:
            # Expected now and then: the trainer renamed a newer checkpoint into place while this one was read.
            self.log(f"checkpoint {folder.name} was replaced while it was read; the next checkpoint is uploaded")
            return
        except Exception as exc:
            self.log(f"could not upload the checkpoint's adapter: {describe_error(exc)}")
            return
        self.log(f"{what or 'checkpoint adapter'} uploaded ({folder.name}, {archive.stat().st_size} bytes)")

    def upload_logs(self) -> None:
        try:
            storage = self.storage()
            target = self.config.logs_key if isinstance(storage, DirStorage) else self.config.logs_upload_url
            if target and self.logs_path.exists():
                storage.upload(target, self.logs_path)
        except Exception as exc:
            # Logs are a convenience; their loss must not fail the run.
            self.log(f"could not upload logs: {describe_error(exc)}")
