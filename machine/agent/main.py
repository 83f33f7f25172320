"""The agent: runs beside the trainer on the machine (cloud VM, RunPod pod or local process).

One code path everywhere. It reports to the control plane, runs the trainer, exports the
adapter and reports completion:

  heartbeat "preparing" -> fetch the dataset to DATA_DIR/dataset.jsonl
  -> heartbeat "training": run TENSORANT_TRAINER_COMMAND, stream its output, send the
     lines batched in heartbeats (every interval and at phase changes), progress from
     `progress=<0..1>` lines
  -> heartbeat "exporting": zip the output directory to the archive path, upload it
     and the logs -> POST complete {status: ok, sha256, size}
  A trainer that exits non-zero or writes no adapter -> POST complete {status: failed,
  output_exists, last_lines}: the control plane retains the machine only if output exists.

The archive path is DATA_DIR/adapter.zip, except with RunPod network storage on an AWS or
Azure host (presigned URLs plus the volume's keys): DATA_DIR/runs/<RUN_ID>/adapter.zip.

Afterwards it idles, sending nothing, until the control plane stops or deletes the
machine (SIGTERM exits). The data directory survives a retained machine, so the archive
can be recovered from it.

Restarts (a RunPod resume, a VM restart) start the agent again on the same data directory:
DATA_DIR/agent-state.json (written atomically) records the phase reached, the trainer's
exit, the adapter's sha256, the completion and whether it was sent, and a stop. A finished
or stopped phase is never run again and the output folder is never wiped: a stopped or
completed run idles, a finished trainer goes straight to export, a trainer interrupted
without a recorded stop is reported failed with its output kept. A heartbeat reply with
`stop: true` stops the trainer (SIGTERM, SIGKILL after TENSORANT_STOP_GRACE_S, 30), records
the stop and idles; a reply's `token` replaces the run token (tokens are short-lived). A
retained machine started again after hours comes back with an expired token: a call refused
401 offers it once to POST /api/agent/runs/{id}/restart, which answers a fresh token and
storage access when the control plane started the machine after the token was issued.

Checkpoints: the trainer gets TENSORANT_CHECKPOINT_DIR=DATA_DIR/checkpoint and
prints `checkpoint step=<k>` after each one it completes. The agent then uploads that
checkpoint's adapter files (its manifest says `checkpoint_step`) to the adapter's storage
key, at once rather than when stopped: a retained machine is stopped without warning (the
local provider freezes it, a lost heartbeat may mean it is dead), so `recover --verify-saved`
finds the last checkpoint in storage when no final adapter replaced it. A trainer stopped by a
`stop: true` reply while a checkpoint exists leaves the agent asking, every heartbeat interval,
whether to go on; a reply with `resume: true` (the owner's `recover --resume` moved the run back
to training) runs the trainer again with TENSORANT_RESUME_FROM=<the last checkpoint folder>.

Running as root with TENSORANT_TRAINER_USER set, the trainer runs as that user (its own
HOME, owning the output directory), so it cannot read the agent's environment or state.

Environment: TENSORANT_RUN_ID, TENSORANT_API_URL, TENSORANT_RUN_TOKEN (never printed),
TENSORANT_BASE_MODEL, TENSORANT_DATA_DIR (/workspace/data), TENSORANT_TRAINER_COMMAND
(default: the smoke trainer, `python -m machine.trainer.smoke`), TENSORANT_HEARTBEAT_INTERVAL_S
(30), and storage access: either TENSORANT_STORAGE_DIR with TENSORANT_DATASET_KEY /
TENSORANT_ADAPTER_KEY / TENSORANT_LOGS_KEY, or presigned TENSORANT_DATASET_URL (GET),
TENSORANT_ADAPTER_UPLOAD_URL (PUT) and TENSORANT_LOGS_UPLOAD_URL (PUT); TENSORANT_DATASET_SHA256,
when set, is the dataset's validated sha256: a download that differs fails the run.
On cloud machines all of it may come as one TENSORANT_BOOTSTRAP = base64(JSON object of
strings), decoded at start and laid over the environment (its values win).

The trainer gets TENSORANT_OUTPUT_DIR, TENSORANT_DATASET_PATH, TENSORANT_BASE_MODEL and,
when set, TENSORANT_BASE_MODEL_PATH, TENSORANT_TRAINING (JSON settings) and HF_TOKEN (a
secret: masked in every forwarded line), but never the run token or the storage URLs.

Only the standard library (urllib) and this package are imported, so the agent runs in
any image that has Python and these files (machine/__init__.py and machine/agent/).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from machine.agent.agent import Agent
from machine.agent.config import AgentConfig, overlay_bootstrap


def main(argv: list[str] | None = None) -> int:
    """The entry point of `python -m machine.agent`; this module's docstring is its --help."""
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser = argparse.ArgumentParser(prog="python -m machine.agent", description=summary,
                                     epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)  # no options: the environment configures the agent; --help describes it
    try:
        environ = overlay_bootstrap(os.environ)
        config = AgentConfig.from_env(environ)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    agent = Agent(config, environ=environ)

    def on_term(signum: int, frame: object) -> None:
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_term)
    return agent.run()


if __name__ == "__main__":
    raise SystemExit(main())
