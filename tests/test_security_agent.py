"""The agent's export (docs/security.md, "Agent on the machine"): the trainer owns its output folder
and may still be running something while the agent reads it, so the export reads only the adapter's
three files, each opened from a descriptor of the folder without following any link, writes the
archive mode 0600 and never writes into the trainer's folder.

(The trainer's processes being killed before the export: tests/test_agent_local.py.)
"""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapter_format.smoke import CONFIG_NAME, MANIFEST_NAME, WEIGHTS_NAME, build_adapter_files
from adapter_format.verify import verify_adapter
from machine.agent.config import AgentConfig
from machine.agent.state import Failed
from machine.agent.uploads import ADAPTER_FILES, Uploads

TINY = "tensorant/smoke-tiny"
SECRET = b"HF_TOKEN=hf_" + b"s3cr3t" * 6 + b"\0TENSORANT_BOOTSTRAP=eyJydW4iOiJ4In0="


def uploads(tmp_path: Path) -> Uploads:
    storage = tmp_path / "storage"
    storage.mkdir()
    config = AgentConfig(run_id="r1", api_url="http://127.0.0.1:9", token="t", base_model=TINY,
                         data_dir=tmp_path / "data", trainer_command="true", storage_dir=str(storage),
                         adapter_key="runs/r1/adapter.zip")
    (tmp_path / "data" / "adapter").mkdir(parents=True)
    return Uploads(config, lambda _line: None, output=tmp_path / "data" / "adapter",
                   logs_path=tmp_path / "data" / "logs.txt")


def write_adapter(output: Path, *, manifest: bool = True) -> None:
    for name, data in build_adapter_files(TINY).items():
        if manifest or name != MANIFEST_NAME:
            (output / name).write_bytes(data)


def uploaded(tmp_path: Path) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO((tmp_path / "storage" / "runs" / "r1" / "adapter.zip").read_bytes()))


def agent_secret(tmp_path: Path) -> Path:
    """Plays /proc/<agent pid>: a folder whose `environ` holds the agent's secrets."""
    proc = tmp_path / "proc-agent"
    proc.mkdir()
    (proc / "environ").write_bytes(SECRET)
    return proc


def swap_on_first_open(monkeypatch: pytest.MonkeyPatch, swap: Callable[[], None]) -> None:
    """Runs swap() when the agent first opens an adapter file: the trainer's daemon acting after
    the agent looked at the folder, deterministically (the race the issue reproduced with a thread)."""
    real_open = os.open
    done: list[bool] = []

    def watched(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if not done and str(path).endswith(CONFIG_NAME):
            done.append(True)
            swap()
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", watched)


def test_a_folder_swapped_for_a_link_to_proc_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    up = uploads(tmp_path)
    write_adapter(up.output)
    (up.output / "sub").mkdir()
    (up.output / "sub" / "environ").write_bytes(b"harmless")
    proc = agent_secret(tmp_path)

    def swap() -> None:  # the listed folder becomes a link to the agent's /proc entry
        (up.output / "sub").rename(up.output / "sub.was")
        (up.output / "sub").symlink_to(proc, target_is_directory=True)

    swap_on_first_open(monkeypatch, swap)
    up.export()
    zf = uploaded(tmp_path)
    assert sorted(zf.namelist()) == sorted(ADAPTER_FILES)
    assert all(SECRET[:20] not in zf.read(name) for name in zf.namelist())


def test_only_the_adapter_files_are_exported(tmp_path: Path) -> None:
    up = uploads(tmp_path)
    write_adapter(up.output)
    (up.output / "notes.txt").write_text("extra")
    (up.output / "runs").mkdir()
    (up.output / "runs" / "events.bin").write_bytes(b"x" * 100)
    sha256, size = up.export()
    zf = uploaded(tmp_path)
    assert sorted(zf.namelist()) == sorted(ADAPTER_FILES)
    data = (tmp_path / "storage" / "runs" / "r1" / "adapter.zip").read_bytes()
    assert verify_adapter(data, base_model=TINY, expected_sha256=sha256).ok and size == len(data)


def test_the_archive_on_the_machine_is_mode_0600(tmp_path: Path) -> None:
    up = uploads(tmp_path)
    write_adapter(up.output)
    final = up.archive_path()
    final.write_bytes(b"an older archive")
    final.chmod(0o644)
    up.export()
    assert stat.S_IMODE(final.stat().st_mode) == 0o600
    assert zipfile.ZipFile(final).namelist()  # the new archive replaced the old one


@pytest.mark.parametrize("name", [WEIGHTS_NAME, CONFIG_NAME, MANIFEST_NAME])
def test_an_adapter_file_that_is_a_link_fails_the_export(tmp_path: Path, name: str) -> None:
    up = uploads(tmp_path)
    write_adapter(up.output)
    state = tmp_path / "data" / "agent-state.json"
    state.write_text('{"token": "run-token"}')
    (up.output / name).unlink()
    (up.output / name).symlink_to(state)
    with pytest.raises(Failed, match=re.escape(f"{name} in adapter is missing, a link or not a regular file")) as caught:
        up.export()
    assert caught.value.stage == "export"
    assert not (tmp_path / "storage" / "runs").exists()  # nothing uploaded


def test_a_missing_manifest_is_written_into_the_archive_not_the_trainers_folder(tmp_path: Path) -> None:
    up = uploads(tmp_path)
    write_adapter(up.output, manifest=False)
    sha256, _ = up.export()
    assert not (up.output / MANIFEST_NAME).exists()
    data = (tmp_path / "storage" / "runs" / "r1" / "adapter.zip").read_bytes()
    result = verify_adapter(data, base_model=TINY, expected_sha256=sha256)
    assert result.ok, result.problems
    assert result.summary["trainer"] == "unknown (manifest written by the agent)"


def test_a_dangling_manifest_link_writes_nothing_where_it_points(tmp_path: Path) -> None:
    # As root, writing the manifest through the trainer's link would create any file on the machine.
    up = uploads(tmp_path)
    write_adapter(up.output, manifest=False)
    target = tmp_path / "etc-cron.d-evil"
    (up.output / MANIFEST_NAME).symlink_to(target)
    with pytest.raises(Failed, match=r"manifest\.json in adapter is missing, a link"):
        up.export()
    assert not target.exists()
