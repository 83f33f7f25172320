"""The agent resumes from the checkpoint of the highest step, compared as numbers (machine/agent/trainer.py):
as strings step-99 came after step-100 and a resume went back 1 step... or 900,000."""

from __future__ import annotations

from pathlib import Path

from machine.agent.trainer import newest_checkpoint


def _checkpoint(root: Path, name: str, complete: bool = True) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    if complete:
        (folder / "manifest.json").write_text("{}")
    return folder


def test_the_newest_checkpoint_is_the_highest_step_as_a_number(tmp_path: Path) -> None:
    assert newest_checkpoint(tmp_path) is None
    for name in ("step-99", "step-100", "step-000998", "step-9"):
        _checkpoint(tmp_path, name)
    assert newest_checkpoint(tmp_path) == tmp_path / "step-000998"
    _checkpoint(tmp_path, "step-1000000")  # past the trainer's 6-digit padding
    assert newest_checkpoint(tmp_path) == tmp_path / "step-1000000"
    _checkpoint(tmp_path, "step-2000000", complete=False)  # not renamed into place whole: not a checkpoint
    _checkpoint(tmp_path, "step-zzz")  # not a step number
    _checkpoint(tmp_path, "step-\u0669\u0669\u0669\u0669\u0669\u0669\u0669\u0669")  # digits, but not ASCII ones
    assert newest_checkpoint(tmp_path) == tmp_path / "step-1000000"
