"""host.json queue settings and local.settings.json, read the way the Functions host reads them."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.(\d+))?$")


def timespan_s(value: Any, default: float) -> float:
    """Seconds from a host.json TimeSpan ("00:00:30", "1.00:00:00") or a number of milliseconds."""
    if value is None or value == "":
        return default
    if isinstance(value, (int, float)):
        return float(value) / 1000.0  # Functions v1 style: milliseconds
    m = _TIMESPAN.match(str(value).strip())
    if not m:
        raise ValueError(f"host.json: {value!r} is not a TimeSpan like 00:00:30")
    days, h, mi, s, frac = m.groups()
    total = int(days or 0) * 86400 + int(h) * 3600 + int(mi) * 60 + int(s)
    return total + (float("0." + frac) if frac else 0.0)


@dataclass(frozen=True)
class HostConfig:
    """The host.json settings this host honours (defaults are the Functions defaults, except polling),
    and the real host's fixed figures, settable here for tests."""

    batch_size: int = 16
    new_batch_threshold: int = 8
    max_dequeue_count: int = 5
    visibility_timeout_s: float = 0.0
    # Functions' default is one minute; a dev host that waits that long feels broken.
    max_polling_interval_s: float = 2.0
    message_encoding: str = "base64"
    route_prefix: str = "api"
    # Enforced: an invocation past it restarts the worker (worker.py). Tests set a short one.
    function_timeout_s: float = 300.0

    # While a function runs, its message is kept invisible by a lease renewed at half of it, as the
    # Functions host's QueueListener does (10 minutes, renewed every 5): a host killed mid-step
    # (kill -9) loses the message for the rest of the lease, 5 to 10 minutes. Not a host.json
    # setting on Azure either; tests set a short one.
    processing_lease_s: int = 600

    # The worker's one pool for every invocation (HTTP, queues, timers); 0: as the Python worker,
    # PYTHON_THREADPOOL_THREAD_COUNT or min(32, cpu+4).
    worker_threads: int = 0

    @classmethod
    def from_host_json(cls, data: dict[str, Any]) -> HostConfig:
        ext = data.get("extensions") or {}
        q = ext.get("queues") or {}
        http = ext.get("http") or {}
        batch = int(q.get("batchSize", cls.batch_size))
        if not 1 <= batch <= 32:
            raise ValueError("host.json: extensions.queues.batchSize must be between 1 and 32")
        encoding = str(q.get("messageEncoding", cls.message_encoding)).lower()
        if encoding not in ("base64", "none"):
            raise ValueError("host.json: extensions.queues.messageEncoding must be base64 or none")
        return cls(
            batch_size=batch,
            new_batch_threshold=int(q.get("newBatchThreshold", batch // 2)),
            max_dequeue_count=max(1, int(q.get("maxDequeueCount", cls.max_dequeue_count))),
            visibility_timeout_s=timespan_s(q.get("visibilityTimeout"), cls.visibility_timeout_s),
            max_polling_interval_s=max(0.1, timespan_s(q.get("maxPollingInterval"), cls.max_polling_interval_s)),
            message_encoding=encoding,
            route_prefix=str(http.get("routePrefix", cls.route_prefix)).strip("/"),
            function_timeout_s=timespan_s(data.get("functionTimeout"), cls.function_timeout_s),
        )

    @classmethod
    def load(cls, root: Path) -> HostConfig:
        path = root / "host.json"
        if not path.exists():
            return cls()
        return cls.from_host_json(json.loads(path.read_text()))


def load_local_settings(path: Path) -> dict[str, Any]:
    """Put local.settings.json "Values" into the environment without overriding what is set.

    Returns the file's "Host" section (LocalHttpPort, CORS) so the caller can use it.
    """
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if data.get("IsEncrypted"):
        raise ValueError(f"{path}: encrypted local settings are not supported; set IsEncrypted to false")
    for key, value in (data.get("Values") or {}).items():
        if key not in os.environ and value is not None:
            os.environ[key] = str(value)
    host: dict[str, Any] = data.get("Host") or {}
    return host
