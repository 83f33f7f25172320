"""The app's logs reach the Functions worker's channel: a fresh interpreter arranged as the Python worker
arranges it (its handler on the root logger, level INFO, and the invocation id in its dispatcher's
thread-local, all before the app is imported), then the app imported, a direct log line and a queue step
run. Before, Powertools' SuppressFilter("tensorant") on the root handler dropped every one of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_WORKER = r"""
import json, logging, sys, threading, types

records = []
class WorkerHandler(logging.Handler):  # stands for the worker's AsyncLoggingHandler
    def emit(self, record):
        records.append(record)
logging.getLogger().addHandler(WorkerHandler())
logging.getLogger().setLevel(logging.INFO)
# The worker keeps the running invocation's id in a thread-local its dispatcher reads.
local = threading.local()
dispatcher = types.ModuleType("azure_functions_worker.dispatcher")
dispatcher.get_current_invocation_id = lambda: getattr(local, "invocation_id", None)
package = types.ModuleType("azure_functions_worker")
package.dispatcher = dispatcher
sys.modules.update({"azure_functions_worker": package, "azure_functions_worker.dispatcher": dispatcher})

import function_app  # noqa: E402,F401

assert logging.getLogger("azure.core.pipeline.policies.http_logging_policy").getEffectiveLevel() == logging.WARNING
from shared.errors import NotFound  # noqa: E402
from shared.log import get_logger, register_secret  # noqa: E402
from shared.steps import Step  # noqa: E402
from shared.services.steps.runner import run_step  # noqa: E402

register_secret("hunter2-secret-value")
local.invocation_id = "inv-direct"
get_logger().warning("a direct warning with hunter2-secret-value", extra={"provider": "aws"})

def handler(ctx, msg):
    get_logger().info("inside the step")
    raise NotFound("the run is gone")

local.invocation_id = "inv-step"
run_step(Step.retain, json.dumps({"org": "org-a", "run_id": "r-123"}), handler)
local.invocation_id = None
# The SDK's per-request line at INFO must not reach the worker.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").info("Request URL: 'https://x'")
print(json.dumps([{"name": r.name, "level": r.levelname, "message": r.getMessage(),
                   **{k: getattr(r, k, None) for k in ("invocation_id", "run_id", "org", "step", "provider")},
                   "root_filters": [type(f).__name__ for f in logging.getLogger().handlers[0].filters]}
                  for r in records]))
"""


def test_records_reach_the_worker_handler_with_level_invocation_and_run() -> None:
    done = subprocess.run([sys.executable, "-c", _WORKER], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "", "PYTHONPATH": str(ROOT), "TENSORANT_ENV": "test"})
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(done.stdout.strip().splitlines()[-1])
    app = [r for r in records if r["name"] == "tensorant"]
    direct, inside, gone = app
    assert direct["level"] == "WARNING" and direct["invocation_id"] == "inv-direct"
    assert direct["message"] == "a direct warning with ***" and direct["provider"] == "aws"
    assert direct["run_id"] == "-"
    assert inside == {**inside, "level": "INFO", "message": "inside the step", "invocation_id": "inv-step",
                      "run_id": "r-123", "org": "org-a", "step": "retain"}
    assert gone["message"] == "the run no longer exists; nothing to do" and gone["run_id"] == "r-123"
    assert all(r["root_filters"] == [] for r in records)  # nothing suppresses the worker's handler
    assert not [r for r in records if r["name"].startswith("azure.core")]
    # Nothing printed besides: the worker's handler took the records (no second copy on stdout).
    assert len(done.stdout.strip().splitlines()) == 1, done.stdout[:2000]


def test_without_a_root_handler_the_app_prints_json_lines() -> None:
    code = ("from shared.log import get_logger, log_context\n"
            "with log_context(step='sweeper', run_id='r-9'):\n"
            "    get_logger().info('swept', extra={'leaks': 2})\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    record = json.loads(line)
    assert record["message"] == "swept" and record["level"] == "INFO" and record["leaks"] == 2
    assert record["step"] == "sweeper" and record["run_id"] == "r-9" and record["service"] == "tensorant"
