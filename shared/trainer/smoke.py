"""Smoke trainer: it does NOT train anything (`python -m shared.trainer.smoke`).

It exists so the whole path (agent, heartbeats, export, upload, verification, release)
can run on a machine without a GPU. It counts the dataset's rows, prints progress lines
the agent understands, and writes a correctly shaped LoRA adapter of random small values
for a declared base model (shared.adapters.base_models), with a manifest that says
"trainer": "smoke (no training)".

Environment:
  TENSORANT_OUTPUT_DIR         where adapter_config.json, adapter_model.safetensors, manifest.json go
  TENSORANT_BASE_MODEL         a base model declared in shared.adapters.base_models
  TENSORANT_DATASET_PATH       the JSONL dataset (rows are counted, nothing else)
  TENSORANT_SMOKE_STEPS        number of fake steps (default 5)
  TENSORANT_SMOKE_STEP_SECONDS sleep per step (default 0.2)
  TENSORANT_SMOKE_FAIL         when set, exit with this code after the first step (tests)
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from shared.adapters.smoke import build_adapter_files


def count_rows(path: str) -> int:
    if not path:
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def main() -> int:
    output = os.environ.get("TENSORANT_OUTPUT_DIR", "")
    base_model = os.environ.get("TENSORANT_BASE_MODEL", "")
    if not output or not base_model:
        print("smoke trainer: TENSORANT_OUTPUT_DIR and TENSORANT_BASE_MODEL must be set", file=sys.stderr)
        return 2
    steps = max(1, int(os.environ.get("TENSORANT_SMOKE_STEPS", "5")))
    step_seconds = float(os.environ.get("TENSORANT_SMOKE_STEP_SECONDS", "0.2"))
    fail = os.environ.get("TENSORANT_SMOKE_FAIL", "")
    rows = count_rows(os.environ.get("TENSORANT_DATASET_PATH", ""))
    print(f"smoke trainer (no training): base_model={base_model} rows={rows} steps={steps}", flush=True)
    for step in range(1, steps + 1):
        time.sleep(step_seconds)
        loss = 2.0 * math.exp(-step / steps)  # a made-up curve, so logs look like a run
        print(f"progress={step / steps:.3f} step={step} loss={loss:.4f}", flush=True)
        if fail:
            print(f"smoke trainer: failing on purpose with exit code {fail}", file=sys.stderr, flush=True)
            return int(fail)
    try:
        files = build_adapter_files(base_model, rows=rows)
    except ValueError as exc:
        print(f"smoke trainer: {exc}", file=sys.stderr, flush=True)
        return 3
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        tmp = out / (name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(out / name)
    print(f"smoke trainer: wrote {', '.join(sorted(files))} to {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
