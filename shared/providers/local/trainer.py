"""The local provider's default trainer (`python -m shared.providers.local.trainer`, DEFAULT_TRAINER):
machine.trainer.run, the same entry the training image runs.

The agent runs it on the control plane's host with the trainer contract's environment plus
TENSORANT_MODEL_CACHE (<TENSORANT_LOCAL_ROOT>/models, set by LocalCompute), so converted and
built base models are shared by every local run. What it prepares, and why in the trainer: see
machine/trainer/run.py. This module stays so a configured command naming it keeps working.
"""

from __future__ import annotations

import sys

from machine.trainer.run import main, prepare

__all__ = ["main", "prepare"]

if __name__ == "__main__":
    sys.exit(main())
