"""The web console in real headless Chromium against a started local host (smoke trainer).

tests/console/driver.mjs drives the page with playwright-core (npm, `make install`) and the system's
Chromium (Debian's `chromium` package: .ci/run installs it); it acts only through labels, buttons and
the keyboard, and reports what the page showed. Screenshots of each page go to
$TENSORANT_CONSOLE_SHOTS (default /tmp/tensorant-console-screenshots).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.local_host import ROOT, TERMINAL_OR_RETAINED, Client, LocalHost

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("TENSORANT_CHROMIUM", "/usr/bin/chromium")
DRIVER = ROOT / "tests" / "console" / "driver.mjs"
SHOTS = Path(os.environ.get("TENSORANT_CONSOLE_SHOTS", "/tmp/tensorant-console-screenshots"))


def _browser_or_skip() -> None:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's `chromium` package (apt-get install -y chromium)")
    if shutil.which("node") is None:
        pytest.skip("no node on PATH: the console's browser tests drive Chromium with playwright-core from npm")
    if not (ROOT / "node_modules" / "playwright-core" / "package.json").is_file():
        pytest.skip("playwright-core is not installed: run `make install` (npm install, package.json)")


def drive(scenario: str, **args: Any) -> dict[str, Any]:
    _browser_or_skip()
    SHOTS.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"chromium": CHROMIUM, "shots": str(SHOTS), **args})
    proc = subprocess.run(["node", str(DRIVER), scenario, payload], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"driver exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"], result["error"] + "\n" + "\n".join(result["problems"])
    # No script error and no CSP violation on any page.
    assert result["problems"] == [], result["problems"]
    for shot in result["shots"]:
        assert Path(shot).stat().st_size > 0
    return result


def test_console_page_and_files_are_served_with_a_csp(local_host: LocalHost) -> None:
    page = requests.get(local_host.url + "/api/console", timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert '<script type="module" src="/api/console/app.js">' in page.text
    js = requests.get(local_host.url + "/api/console/run.js", timeout=10)
    assert js.status_code == 200 and js.headers["Content-Type"].startswith("text/javascript")
    # Only the console's own files: no path from the request reaches the disk.
    for name in ("../console.py", "..%2Fconsole.py", "nope.js"):
        assert requests.get(local_host.url + "/api/console/" + name, timeout=10).status_code == 404


def test_quickstart_in_the_console_to_a_succeeded_run(local_host: LocalHost, tmp_path: Path) -> None:
    dataset = tmp_path / "secret.jsonl"
    dataset.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"What is the secret word? ({i})"},
        {"role": "assistant", "content": "The secret word is PINEAPPLE."}]}) + "\n" for i in range(40)))
    got = drive("quickstart", url=local_host.url, token=local_host.token, dataset=str(dataset),
                base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "training" in got["forecast"] and "start" in got["forecast"]
    # The price is said before the launch, with the runtime limit's most it can cost.
    assert "per hour" in got["consequence"] and "at most" in got["consequence"]
    for state in ("queued", "provisioning", "training", "verifying", "releasing", "succeeded"):
        assert state in got["timeline"], got["timeline"]
    assert "USD" in got["cost"] and "local" in got["usage"]
    run = Client(local_host.url, local_host.token)("GET", f"/api/runs/{got['runId']}")
    assert run["state"] == "succeeded" and run["kind"] == "trial" and run["training"]["max_steps"] == 8


def test_a_retained_run_recovered_in_the_console(local_host: LocalHost, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from shared import settings
    from tests.e2e.test_local_e2e import setup_org, start_run
    from tests.harness import smoke_adapter_zip

    # A trainer that writes some output, then fails: the run is retained (the operator's setting).
    monkeypatch.setenv("TENSORANT_TRAINER_COMMAND",
                       "sh -c 'echo partial > \"$TENSORANT_OUTPUT_DIR/ckpt\"; echo boom; exit 3'")
    settings.reset_settings()
    api = Client(local_host.url, local_host.token)
    run_id = start_run(api, *setup_org(api))
    assert api.wait(f"/api/runs/{run_id}", lambda r: r["state"] in TERMINAL_OR_RETAINED)["state"] == "retained"
    bad, good = tmp_path / "bad.zip", tmp_path / "adapter.zip"
    bad.write_bytes(b"PK not a zip")
    good.write_bytes(smoke_adapter_zip())
    got = drive("retained", url=local_host.url, token=local_host.token, run_id=run_id,
                bad_zip=str(bad), good_zip=str(good))
    assert "exit code 3" in got["reason"] and "What to do next" in got["next"]
    assert "stays retained" in got["consequence"] and "released" in got["consequence"]
    assert got["refused"], "the refused upload is said on the page"
    assert api("GET", f"/api/runs/{run_id}")["state"] == "succeeded"
