"""The fleet's metrics reach an OpenTelemetry meter provider (in Azure, the Azure Monitor distro's, exporting to
Application Insights customMetrics): a step's duration from its log context, a sweep's findings, gauges."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_PROBE = r"""
import json
from opentelemetry import metrics as otel
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

reader = InMemoryMetricReader()
otel.set_meter_provider(MeterProvider(metric_readers=[reader]))
from shared import metrics
from shared.log import log_context

with log_context(step="launch", run_id="r-1"):
    pass
try:
    with log_context(step="release", run_id="r-2"):
        raise RuntimeError("boom")
except RuntimeError:
    pass
metrics.record_sweep({"sweep_id": "s-1", "dry_run": False, "leak": 2, "stuck_release": 0})
metrics.gauge(metrics.POISON_DEPTH, 3, queue="launch-poison")
metrics.count(metrics.FAILED_STARTS, cause="pull")
out = {}
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            out[m.name] = [{"attributes": dict(p.attributes),
                            "value": getattr(p, "value", None), "count": getattr(p, "count", None)}
                           for p in m.data.data_points]
print(json.dumps(out))
"""


def test_metrics_reach_the_meter_provider() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    durations = {(p["attributes"]["step"], p["attributes"]["outcome"]): p["count"] for p in got["tensorant.step.duration"]}
    assert durations == {("launch", "done"): 1, ("release", "failed"): 1}
    assert got["tensorant.sweep.findings"] == [{"attributes": {"kind": "leak"}, "value": 2, "count": None}]
    assert got["tensorant.sweep.finished"][0]["value"] == 1
    assert got["tensorant.queue.poison_depth"][0] == {"attributes": {"queue": "launch-poison"}, "value": 3, "count": None}
    assert got["tensorant.starts.failed"][0]["attributes"] == {"cause": "pull"}


def test_fleet_gauges_reset_every_state_and_provider_each_export(harness: Any, cloud: Any, monkeypatch: Any) -> None:
    """After a run ended, runs{training} and machines.billing{<provider>} read 0, not their last value (issue
    38.8: fleet_metrics set only the states and providers present)."""
    from shared import metrics
    from shared.services.timers import heartbeat_check
    from tests.harness import smoke_adapter_zip

    last: dict[tuple[str, str], float] = {}

    def record(name: str, value: float, **attributes: Any) -> None:
        [(_, label)] = attributes.items()
        last[(name, label)] = value

    monkeypatch.setattr(metrics, "gauge", record)
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.3)
    heartbeat_check.check_all(harness.ctx)
    assert last[(metrics.RUNS, "training")] == 1
    assert last[(metrics.MACHINES_BILLING, "memory")] == 1 and last[(metrics.COST_PER_HOUR, "memory")] > 0
    harness.agent(run_id).train(smoke_adapter_zip())
    harness.drain()
    assert harness.get_run(run_id)["state"] == "succeeded"
    heartbeat_check.check_all(harness.ctx)
    assert last[(metrics.RUNS, "training")] == 0
    assert last[(metrics.MACHINES_BILLING, "memory")] == 0 and last[(metrics.COST_PER_HOUR, "memory")] == 0
    # Every watched state and every provider is reported, present or not.
    assert last[(metrics.RUNS, "exporting")] == 0 and last[(metrics.MACHINES_BILLING, "local")] == 0
