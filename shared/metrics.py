"""The fleet's metrics, recorded with the OpenTelemetry metrics API.

OpenTelemetry is the Functions ecosystem's choice for Python: with PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY
(set by infra/controlplane/main.bicep) the worker configures the Azure Monitor distro, whose meter provider
exports every instrument here to Application Insights as customMetrics (name, value, attributes as
customDimensions), where the template's alerts query them. Without a configured provider (tests, make
run) the API's no-op provider drops them, and without the package at all nothing is recorded.

Names are constants: the alert queries name them (tests/test_infra.py keeps both in step).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

RUNS = "tensorant.runs"  # gauge: runs by state
MACHINES_BILLING = "tensorant.machines.billing"  # gauge: machines held (billing), by provider
COST_PER_HOUR = "tensorant.cost_per_hour"  # gauge: USD per hour of the machines held, by provider
STEP_DURATION = "tensorant.step.duration"  # histogram (s): one queue step, by step and outcome
FAILED_STARTS = "tensorant.starts.failed"  # counter: machine starts that failed, by cause
SWEEP_FINDINGS = "tensorant.sweep.findings"  # counter: what a sweep found, by kind (leak, stuck_release, ...)
SWEEP_FINISHED = "tensorant.sweep.finished"  # counter: sweeps that ran to the end
POISON_DEPTH = "tensorant.queue.poison_depth"  # gauge: messages in a <queue>-poison queue, by queue

_lock = threading.Lock()
_instruments: dict[str, Any] = {}


def _meter() -> Any:
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    return metrics.get_meter("tensorant")


def _instrument(name: str, kind: str, unit: str = "") -> Any:
    # Created once per process; the API proxies to whatever provider is configured, even one set later.
    with _lock:
        if name not in _instruments:
            meter = _meter()
            if meter is None:
                _instruments[name] = None
            else:
                _instruments[name] = getattr(meter, f"create_{kind}")(name, unit=unit)
        return _instruments[name]


def _clean(attributes: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in attributes.items() if v is not None}


def gauge(name: str, value: float, **attributes: Any) -> None:
    instrument = _instrument(name, "gauge")
    if instrument is not None:
        instrument.set(value, _clean(attributes))


# The label values each gauge family has been set for in this process, so that each export sets them all.
_gauge_labels: dict[str, set[str]] = {}


def gauges(name: str, label: str, values: Mapping[str, float], every: Iterable[str] = ()) -> None:
    """One gauge family, whole: `values` by `label`, and a zero for each of `every` and for each label value
    set before in this process and absent now. A gauge keeps its last value in every export until set
    again, so a state or provider left out would report a run or machine long gone."""
    with _lock:
        labels = _gauge_labels.setdefault(name, set())
        labels.update(every, values)
        todo = sorted(labels)
    for value in todo:
        gauge(name, values.get(value, 0), **{label: value})


def count(name: str, amount: float = 1, **attributes: Any) -> None:
    instrument = _instrument(name, "counter")
    if instrument is not None and amount:
        instrument.add(amount, _clean(attributes))


def seconds(name: str, value: float, **attributes: Any) -> None:
    instrument = _instrument(name, "histogram", unit="s")
    if instrument is not None:
        instrument.record(value, _clean(attributes))


def record_sweep(stats: dict[str, Any]) -> None:
    """A finished sweep's findings (its stats: counts by kind) and the fact that it finished."""
    for kind, value in stats.items():
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            count(SWEEP_FINDINGS, value, kind=kind)
    count(SWEEP_FINISHED)
