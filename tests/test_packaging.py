"""Packaging facts: requirements.txt matches pyproject, and importing the app loads no cloud SDK."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_requirements_txt_matches_pyproject() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert sorted(reqs) == sorted(deps)


def test_import_function_app_loads_no_provider_sdk() -> None:
    from shared.providers.registry import sdk_modules

    code = (f"import sys, function_app; sdks = {tuple(sdk_modules())!r}; "
            "print(','.join(sorted(m for m in sys.modules if any(m == s or m.startswith(s + '.') for s in sdks))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_host_json_queue_settings() -> None:
    import json

    queues = json.loads((ROOT / "host.json").read_text())["extensions"]["queues"]
    assert queues["messageEncoding"] == "base64"
    assert queues["maxDequeueCount"] >= 3
    assert {"batchSize", "visibilityTimeout", "maxPollingInterval"} <= set(queues)
