"""The training image, run for real (`make image-check`; skipped in `make test`).

The image built from the repository's Dockerfile by tools/image/build.sh (buildah, no Docker
engine) is named by TENSORANT_IMAGE_CHECK. An AWS launch on moto sends its user data; the played
machine (tests/machine.py) runs it, and its `docker run` is `buildah run --isolation chroot` of
the image's own ENTRYPOINT with the same env file and data volume (tests/docker_shim.py, mode
buildah), on the host network, against this control plane's HTTP host. Two runs end succeeded
with a verified adapter: the image's default trainer (the real LoRA trainer, python -m
machine.trainer.run) on the declared tiny Llama, and the smoke trainer.
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from shared import settings
from shared.providers import cloudinit
from tests.e2e.boot import BootHarness, finish
from tests.machine import Machine

IMAGE = os.environ.get("TENSORANT_IMAGE_CHECK", "")
pytestmark = [pytest.mark.e2e, pytest.mark.image,
              pytest.mark.skipif(not IMAGE, reason="make image-check builds the image and sets TENSORANT_IMAGE_CHECK")]


def _run_in_image(h: BootHarness, ec2: Any, tmp_path: Path, base_model: str) -> tuple[dict[str, Any], Machine, float]:
    started = time.monotonic()
    offer = next(o for o in h.ok("GET", "/api/catalog/gpus", params={"provider": "aws"})["items"]
                 if o["machine_type"] == "g6.xlarge")
    run_id = h.create_run("aws", offer["offer_id"], runtime_limit_s=7200, base_model=base_model,
                          training={"max_steps": 4, "max_seq_len": 64, "batch_size": 2})
    run = h.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], h.step_errors)
    instance = next(r["id"] for r in run["resources"] if r["kind"] == "instance")
    user_data = ec2.describe_instance_attribute(InstanceId=instance, Attribute="userData")["UserData"]["Value"]
    machine = Machine(tmp_path / "vm", h.clock, run="buildah", image=IMAGE)
    machine.boot(base64.b64decode(user_data).decode())
    run = finish(h, run_id, machine, timeout=900)
    return run, machine, time.monotonic() - started


def _manifest(machine: Machine) -> dict[str, Any]:
    data = (machine.path(cloudinit.HOST_DATA_DIR) / "adapter.zip").read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        manifest: dict[str, Any] = json.loads(zf.read("manifest.json"))
    return manifest


def test_the_images_own_trainer_trains_through_its_entrypoint(boot_aws_h: tuple[BootHarness, Any], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORANT_TRAINER_COMMAND")  # the image's default: the real LoRA trainer
    settings.reset_settings()
    h, ec2 = boot_aws_h
    run, machine, took = _run_in_image(h, ec2, tmp_path, "tensorant/tiny-llama")
    assert run["state"] == "succeeded", f"{run['reason']}\n{h.step_errors}\n{machine.console()[-4000:]}"
    manifest = _manifest(machine)
    assert manifest["trainer"] != "smoke (no training)" and manifest["steps"] == 4, manifest
    # The Hugging Face cache (and the model the trainer prepared) is on the kept data disk.
    assert (machine.path(cloudinit.HOST_DATA_DIR) / "cache" / "huggingface").is_dir()
    print(f"\nimage-check: LoRA run through the image's entrypoint: {took:.0f} s, loss {manifest.get('loss')}")


def test_the_smoke_trainer_runs_inside_the_image(boot_aws_h: tuple[BootHarness, Any], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORANT_TRAINER_COMMAND", "python -m machine.trainer.smoke")
    settings.reset_settings()
    h, ec2 = boot_aws_h
    run, machine, took = _run_in_image(h, ec2, tmp_path, "tensorant/smoke-tiny")
    assert run["state"] == "succeeded", f"{run['reason']}\n{h.step_errors}\n{machine.console()[-4000:]}"
    assert _manifest(machine)["trainer"] == "smoke (no training)"
    print(f"\nimage-check: smoke run through the image's entrypoint: {took:.0f} s")
