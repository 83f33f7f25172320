"""Smoke trainer: it does NOT train anything (`python -m machine.trainer.smoke`).

It exists so the whole path (agent, heartbeats, export, upload, verification, release)
can run on a machine without a GPU. It counts the dataset's rows, prints progress lines
the agent understands, and writes a correctly shaped LoRA adapter of random small values
for a declared base model (adapter_format.base_models), with a manifest that says
"trainer": "smoke (no training)".

Environment:
  TENSORANT_OUTPUT_DIR         where adapter_config.json, adapter_model.safetensors, manifest.json go
  TENSORANT_BASE_MODEL         a base model declared in adapter_format.base_models
  TENSORANT_DATASET_PATH       the JSONL dataset (rows are counted, nothing else)
  TENSORANT_SMOKE_STEPS        number of fake steps (default 5)
  TENSORANT_SMOKE_STEP_SECONDS sleep per step (default 0.2)
  TENSORANT_SMOKE_FAIL         when set, exit with this code after the first step (tests)
Checkpoints (tests of stop and resume, in the real trainer's layout: machine.trainer.lora):
  TENSORANT_CHECKPOINT_DIR     set by the agent; with TENSORANT_SMOKE_CHECKPOINT_EVERY=<k>, every
                               k steps before the last the adapter files and a manifest.json with
                               checkpoint_step and steps are made whole in <dir>/.partial, renamed
                               to <dir>/step-<k, 6 digits> (older ones removed), and
                               `checkpoint step=<k> dir=<path>` is printed
  TENSORANT_RESUME_FROM        a step-<k> folder: continue at step k+1 (the final manifest says
                               resumed_from_step)
  TENSORANT_SMOKE_HOLD_AT      after this step of a run not resumed, wait until stopped (a run long
                               enough for its time limit or its self-protection to stop it there)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

from adapter_format.smoke import MANIFEST_NAME, build_adapter_files


def count_rows(path: str) -> int:
    if not path:
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def with_manifest(files: dict[str, bytes], **extra: object) -> dict[str, bytes]:
    """files with extra keys in manifest.json (its file hashes stay as they were)."""
    manifest = json.loads(files[MANIFEST_NAME])
    manifest.update(extra)
    return {**files, MANIFEST_NAME: (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()}


def write_checkpoint(root: Path, step: int, files: dict[str, bytes]) -> Path:
    """root/step-<step> made whole before it gets its name, as machine.trainer.lora.write_checkpoint does
    (that module imports the real trainer's dependencies): a trainer killed at any moment leaves at least
    one complete checkpoint."""
    partial = root / ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name, data in files.items():
        with open(partial / name, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    final = root / f"step-{step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    for old in root.glob("step-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def main() -> int:
    output = os.environ.get("TENSORANT_OUTPUT_DIR", "")
    base_model = os.environ.get("TENSORANT_BASE_MODEL", "")
    if not output or not base_model:
        print("smoke trainer: TENSORANT_OUTPUT_DIR and TENSORANT_BASE_MODEL must be set", file=sys.stderr)
        return 2
    steps = max(1, int(os.environ.get("TENSORANT_SMOKE_STEPS", "5")))
    step_seconds = float(os.environ.get("TENSORANT_SMOKE_STEP_SECONDS", "0.2"))
    fail = os.environ.get("TENSORANT_SMOKE_FAIL", "")
    every = int(os.environ.get("TENSORANT_SMOKE_CHECKPOINT_EVERY") or 0)
    hold_at = int(os.environ.get("TENSORANT_SMOKE_HOLD_AT") or 0)
    checkpoints = Path(os.environ["TENSORANT_CHECKPOINT_DIR"]) if os.environ.get("TENSORANT_CHECKPOINT_DIR") else None
    resume_from = Path(os.environ["TENSORANT_RESUME_FROM"]) if os.environ.get("TENSORANT_RESUME_FROM") else None
    rows = count_rows(os.environ.get("TENSORANT_DATASET_PATH", ""))
    try:
        files = build_adapter_files(base_model, rows=rows)
    except ValueError as exc:
        print(f"smoke trainer: {exc}", file=sys.stderr, flush=True)
        return 3
    done = 0
    if resume_from is not None:
        try:
            done = int(json.loads((resume_from / MANIFEST_NAME).read_text())["checkpoint_step"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"smoke trainer: cannot resume from {resume_from}: {type(exc).__name__}", file=sys.stderr, flush=True)
            return 4
        print(f"smoke trainer: resuming from {resume_from.name} (step {done} of {steps})", flush=True)
    print(f"smoke trainer (no training): base_model={base_model} rows={rows} steps={steps}", flush=True)
    for step in range(done + 1, steps + 1):
        time.sleep(step_seconds)
        loss = 2.0 * math.exp(-step / steps)  # a made-up curve, so logs look like a run
        print(f"progress={step / steps:.3f} step={step} loss={loss:.4f}", flush=True)
        if fail:
            print(f"smoke trainer: failing on purpose with exit code {fail}", file=sys.stderr, flush=True)
            return int(fail)
        if checkpoints is not None and every > 0 and step % every == 0 and step < steps:
            where = write_checkpoint(checkpoints, step, with_manifest(files, checkpoint_step=step, steps=steps))
            print(f"checkpoint step={step} dir={where}", flush=True)
        if step == hold_at and resume_from is None:
            print(f"smoke trainer: holding at step {step} until stopped", flush=True)
            while True:  # the agent's SIGTERM (or SIGKILL) ends it
                time.sleep(3600)
    if resume_from is not None:
        files = with_manifest(files, steps=steps, resumed_from_step=done)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        tmp = out / (name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(out / name)
    print(f"smoke trainer: wrote {', '.join(sorted(files))} to {out}", flush=True)
    # The real trainer's sample lines (lora.sample_outputs), so the console's base-vs-adapter panel has
    # something to show in tests; a random model generates nothing, and that is what they say.
    print(f"sample prompt: {'What does the smoke trainer answer?'!r}", flush=True)
    print(f"sample base model: {''!r}", flush=True)
    print(f"sample with adapter: {'(the smoke trainer trains nothing: no answer)'!r}", flush=True)
    print(f"sample dataset answer: {'(not read by the smoke trainer)'!r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
