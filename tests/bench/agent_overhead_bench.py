"""The agent's overhead around the trainer: agent wall time minus trainer wall time.

Run: python -m tests.bench.agent_overhead_bench [--seconds 60] [--runs 1] [--heartbeat 30]
The real agent process (`python -m machine.agent`) runs against a recording fake control plane
(heartbeat / complete) with local-directory storage; the trainer is the smoke trainer printing a
progress line every 0.1 s for --seconds (wrapped so it records its own start and end). Agent
wall time runs from spawning the agent until the control plane receives its completion (dataset
fetch, trainer, zip, upload, logs, complete). Goal: overhead under 5 % of a 60 s training.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shared.org_storage.base import adapter_key, dataset_key, logs_key

ROOT = Path(__file__).resolve().parents[2]
STEP_S = 0.1


def trainer() -> int:
    """The timed trainer: the smoke trainer, its wall time written next to its output."""
    from machine.trainer import smoke

    started = time.time()
    code = smoke.main()
    stamp = Path(os.environ["TENSORANT_OUTPUT_DIR"]).parent / "trainer-times.json"
    stamp.write_text(json.dumps({"start": started, "end": time.time()}))
    return code


def one_run(seconds: float, heartbeat_s: float) -> tuple[float, float]:
    from tests.test_agent_local import FakeAgentApi

    api = FakeAgentApi()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            storage, data = Path(tmp) / "storage", Path(tmp) / "data"
            ds = storage / dataset_key("p1", "d1")
            ds.parent.mkdir(parents=True)
            ds.write_text("\n".join(json.dumps({"text": f"row {i}"}) for i in range(100)) + "\n")
            env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ} | {
                "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                "TENSORANT_RUN_ID": "r-bench", "TENSORANT_API_URL": api.url, "TENSORANT_RUN_TOKEN": "bench-token",
                "TENSORANT_BASE_MODEL": "tensorant/smoke-tiny", "TENSORANT_DATA_DIR": str(data),
                "TENSORANT_STORAGE_DIR": str(storage), "TENSORANT_DATASET_KEY": dataset_key("p1", "d1"),
                "TENSORANT_ADAPTER_KEY": adapter_key("r-bench"), "TENSORANT_LOGS_KEY": logs_key("r-bench"),
                "TENSORANT_HEARTBEAT_INTERVAL_S": str(heartbeat_s),
                "TENSORANT_TRAINER_COMMAND": f"{sys.executable} -m tests.bench.agent_overhead_bench --trainer",
                "TENSORANT_SMOKE_STEPS": str(max(1, round(seconds / STEP_S))),
                "TENSORANT_SMOKE_STEP_SECONDS": str(STEP_S),
            }
            t0 = time.time()
            agent = subprocess.Popen([sys.executable, "-m", "machine.agent"], env=env, cwd=tmp,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                done = api.wait_complete("r-bench", timeout=seconds * 3 + 60)
                t_done = time.time()
            finally:
                agent.send_signal(signal.SIGTERM)
                agent.wait(timeout=30)
            assert done["status"] == "ok", done
            times = json.loads(next(data.rglob("trainer-times.json")).read_text())
            return t_done - t0, times["end"] - times["start"]
    finally:
        api.server.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0, help="trainer duration")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--heartbeat", type=float, default=30.0, help="agent heartbeat interval (s)")
    ap.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trainer:
        sys.exit(trainer())
    ratios = []
    for i in range(args.runs):
        agent_s, trainer_s = one_run(args.seconds, args.heartbeat)
        overhead = agent_s - trainer_s
        ratios.append(overhead / trainer_s)
        print(f"run {i + 1}: agent {agent_s:.2f}s  trainer {trainer_s:.2f}s  overhead {overhead:.2f}s "
              f"({100 * overhead / trainer_s:.2f} %)", flush=True)
    worst = max(ratios)
    print(f"agent overhead: worst {100 * worst:.2f} % of the trainer's wall time (goal < 5 %): "
          f"{'OK' if worst < 0.05 else 'OVER'}")


if __name__ == "__main__":
    main()
