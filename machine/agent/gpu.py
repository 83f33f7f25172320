"""The machine's NVIDIA driver against what the image's PyTorch needs: checked before the agent's first
report, so a host whose driver is too old fails its start in seconds (a boot failure, released at
once) instead of training on the CPU for the whole runtime limit.

The image says what it needs in TENSORANT_MIN_NVIDIA_DRIVER (Dockerfile: the pinned torch's CUDA 13
runtime needs 580.65.06 or newer); unset (the local provider, a CPU machine) checks nothing. The
driver's version is read from /proc/driver/nvidia/version, which the NVIDIA container runtime shows
inside the container (TENSORANT_NVIDIA_DRIVER_FILE names another file, for the machine harness); no
such file means no NVIDIA driver here, and that is left to the container start (docker --gpus) and
to the trainer (machine.trainer.lora refuses a GPU torch cannot use). Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

DRIVER_FILE = "/proc/driver/nvidia/version"
EXIT_GPU = 4  # the agent's and the trainer's exit code for "this machine's GPU cannot be used"
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023"
# (open kernel modules: "NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build ...")
_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+){1,2})")


def driver_version(path: str | Path = DRIVER_FILE) -> str | None:
    """The NVIDIA kernel driver's version ("535.104.05"), or None when there is none (or it is unreadable)."""
    try:
        text = Path(path).read_text(errors="replace")[:4096]
    except OSError:
        return None
    found = _VERSION.search(text)
    return found.group(1) if found else None


def _as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def driver_problem(environ: Mapping[str, str]) -> str | None:
    """What to tell the owner when this machine's driver is older than the image needs, else None."""
    needed = environ.get("TENSORANT_MIN_NVIDIA_DRIVER", "").strip()
    if not needed:
        return None
    found = driver_version(environ.get("TENSORANT_NVIDIA_DRIVER_FILE") or DRIVER_FILE)
    if found is None or _as_tuple(found) >= _as_tuple(needed):
        return None
    return (f"the machine's NVIDIA driver is {found}, older than the {needed} this training image's PyTorch "
            "(CUDA 13) needs: it could not use the GPU and would train on the CPU. Choose an offer whose machine "
            f"image has driver {needed.split('.')[0]} or newer (AWS: a current Deep Learning Base AMI; Azure: "
            "an NVIDIA driver extension of 580 or newer; RunPod: a host with CUDA 13), or update the driver, "
            "and launch again")
