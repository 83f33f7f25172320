"""The web console in real headless Chromium against a started local host (smoke trainer).

tests/console/driver.mjs drives the page with playwright-core (npm, `make install`) and the system's
Chromium (Debian's `chromium` package: .ci/run installs it); it acts only through labels, buttons and
the keyboard, and reports what the page showed. Screenshots of each page go to
$TENSORANT_CONSOLE_SHOTS (default /tmp/tensorant-console-screenshots).
"""

from __future__ import annotations

import json
import os
import re
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
    for package in ("playwright-core", "axe-core"):
        if not (ROOT / "node_modules" / package / "package.json").is_file():
            pytest.skip(f"{package} is not installed: run `make install` (npm install, package.json)")


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


# Every compute provider and storage kind, as a user fills their forms (by label); the secrets typed.
SECRETS = {"aws": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "azure": "client~secret.value-123",
           "runpod": "rpa_EXAMPLEKEY0123456789", "s3": "s3-secret-EXAMPLE-0123", "runpod_volume": "rps_EXAMPLE0123"}
COMPUTE = [
    ("aws", {"Region": "us-east-1", "Access key ID": "AKIAIOSFODNN7EXAMPLE", "Secret access key": SECRETS["aws"],
             "AMI ID": "ami-0123456789abcdef0", "Subnet ID": "subnet-0123456789abcdef0",
             "Security group ID": "sg-0123456789abcdef0"}),
    ("azure", {"Tenant ID": "00000000-0000-4000-8000-000000000001", "Client ID": "00000000-0000-4000-8000-000000000002",
               "Client secret": SECRETS["azure"], "Subscription ID": "00000000-0000-4000-8000-000000000003",
               "Resource group": "tensorant-training", "Region": "eastus",
               "Subnet ID": "/subscriptions/00000000-0000-4000-8000-000000000003/resourceGroups/tensorant-training/"
                            "providers/Microsoft.Network/virtualNetworks/training/subnets/default",
               "Image ID": "/subscriptions/00000000-0000-4000-8000-000000000003/resourceGroups/tensorant-training/"
                           "providers/Microsoft.Compute/images/tensorant-trainer",
               "SSH public key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8g t"}),
    ("runpod", {"API key": SECRETS["runpod"]}),
    ("local", {"Price per hour": "0"}),
]
STORAGE = [
    ("Connect S3 storage", "s3", {"Region": "us-east-1", "Bucket": "tensorant-adapters", "Access key ID": "AKIAEXAMPLE01",
                                  "Secret access key": SECRETS["s3"]}),
    ("Use RunPod volume", "runpod_volume", {"Volume ID": "a1b2c3d4e5", "Datacenter ID": "EU-RO-1",
                                            "Access key ID": "user_2abcdef", "Secret access key": SECRETS["runpod_volume"]}),
    ("Use local storage", "local", {}),
]
HF_TOKEN = "hf_" + "EXAMPLEtoken0123456789abcd"
SECRET_FIELDS = {"aws": "secret_access_key", "azure": "client_secret", "runpod": "api_key", "s3": "secret_access_key",
                 "runpod_volume": "secret_access_key"}


def test_quickstart_in_the_console_to_a_succeeded_run(local_host: LocalHost, tmp_path: Path) -> None:
    """Every provider and storage kind configured through the forms (no JSON typed), saved, saved again
    unchanged; then a trial on the local provider from Configure to succeeded."""
    from shared.runs.org_backends import compute_connection_slot, unsealed_config
    from shared.store import get_store

    dataset = tmp_path / "secret.jsonl"
    dataset.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"What is the secret word? ({i})"},
        {"role": "assistant", "content": "The secret word is PINEAPPLE."}]}) + "\n" for i in range(40)))
    got = drive("quickstart", url=local_host.url, token=local_host.token, dataset=str(dataset),
                base_model="HuggingFaceTB/SmolLM2-135M-Instruct", compute=COMPUTE, storage=STORAGE,
                secrets=SECRET_FIELDS, hf_token=HF_TOKEN)
    # Each save and each unchanged re-save was accepted (a re-save sends the secrets back as {"set": true}).
    assert [(s["path"], s["status"]) for s in got["saves"] if s["status"] >= 300] == []
    assert len(got["saves"]) == 2 * (len(COMPUTE) + len(STORAGE)) + 3
    assert SECRETS["runpod"] in json.dumps(COMPUTE) and got["hfType"] == "password"
    assert get_store().connections.get("org-a", compute_connection_slot("runpod")) is None  # disconnected
    assert get_store().secrets.get("org-a", "huggingface-token") is not None and HF_TOKEN not in json.dumps(got["saves"])
    for provider, _ in COMPUTE:
        rec = get_store().connections.get("org-a", compute_connection_slot(provider))
        if provider == "runpod":
            continue
        assert rec is not None, provider
        if provider in SECRET_FIELDS:
            kept = getattr(unsealed_config(rec[0]), SECRET_FIELDS[provider]).get_secret_value()
            assert kept == SECRETS[provider], provider
            assert SECRETS[provider] not in json.dumps(got["saves"])
    assert got["saves"][-1]["body"]["max_active_runs"] == 4
    # The offers show GPU memory and the compute/disk split; price and forecast show before a draft exists.
    assert "no GPU" in got["offerText"] and "compute" in got["offerText"] and "disk" in got["offerText"]
    assert "training" in got["estimate"] and "at most" in got["estimate"]
    assert "Base model" in got["samples"] and "With the adapter" in got["samples"]
    assert "enter the volume ID and datacenter ID" in got["volumesAnswer"], got["volumesAnswer"]
    assert got["offerCount"] == 1  # quick changes of the base model: the offer is listed once
    assert "training" in got["forecast"] and "start" in got["forecast"]
    # The price is said before the launch, with the runtime limit's most it can cost.
    assert "per hour" in got["consequence"] and "at most" in got["consequence"]
    for state in ("queued", "provisioning", "training", "verifying", "releasing", "succeeded"):
        assert state in got["timeline"], got["timeline"]
    assert "USD" in got["cost"] and "local" in got["usage"]
    run = Client(local_host.url, local_host.token)("GET", f"/api/runs/{got['runId']}")
    assert run["state"] == "succeeded" and run["kind"] == "trial" and run["training"]["max_steps"] == 8

    # Every page at 1280 and 390 px: none wider than its viewport, axe-core finds nothing.
    texts = [
        "at the trainer's pace so far ... Next time give it a longer limit (--runtime-limit) or fewer steps "
        "(--set-training max_steps=N)",
        "the archive is the checkpoint at step 50 of 120 (training stopped before its planned steps), not a completed "
        "adapter; resume training from it (recover mode resume), or accept it as the run's adapter (recover again "
        "with accept_checkpoint: true)",
        "raise price_limit_per_hour or runtime_limit_s, or train fewer steps (training max_steps); max_price_limit_per_hour",
    ]
    seen = drive("widths", url=local_host.url, token=local_host.token, run_id=got["runId"], texts=texts)
    said = seen["words"]["said"]
    for text in said:
        assert "--" not in text and "accept_checkpoint" not in text and "recover mode" not in text, text
        assert not re.search(r"\b(price_limit_per_hour|runtime_limit_s|max_steps)\b", text), text
    assert '"Resume training" button' in said[1] and "Accept the checkpoint" in said[1]
    assert "the Price limit" in said[2] and "Max price limit per hour (Connections" in said[2]
    # A run that tried several GPUs: its record holds the candidates and attempts as the launch step writes
    # them (the local provider never refuses), and the real run view carries them to the page: a line per
    # attempt in the timeline with the cloud's code, and the candidate that ran.
    _seed_attempts(got["runId"])
    tried = drive("attempts", url=local_host.url, token=local_host.token, run_id=got["runId"])
    assert len(tried["attemptLines"]) == 3, tried
    assert "refused" in tried["attemptLines"][0] and "InsufficientInstanceCapacity" in tried["attemptLines"][0]
    assert "azure/westeurope" in tried["attemptLines"][1] and "launched" in tried["attemptLines"][2]
    assert "local-smoke" in tried["ranOn"] and "local" in tried["ranOn"]
    assert seen["words"]["samples"] == [{"prompt": "Q?", "base": "", "adapter": "it's A\n", "expected": "A"}]
    assert len(seen["measured"]) == 2 * 6
    too_wide = [m for m in seen["measured"] if m["scroll"] > m["view"]]
    assert too_wide == [], too_wide
    assert seen["violations"] == [], seen["violations"]


def _seed_attempts(run_id: str) -> None:
    from shared.models import GpuOffer, RunAttempt, RunCandidate, RunRecord
    from shared.store import get_store

    def offer(provider: str, offer_id: str, gpu: str, price: float) -> GpuOffer:
        return GpuOffer(provider=provider, offer_id=offer_id, gpu=gpu, gpu_memory_gb=80, machine_type=offer_id,
                        region="r", compute_per_hour=price, disk_per_hour=0, total_per_hour=price)

    def seed(r: RunRecord) -> RunRecord:
        cands = [RunCandidate(connection="aws", offer=offer("aws", "us-east-1/p5.48xlarge", "H100", 3.1)),
                 RunCandidate(connection="azure/westeurope", offer=offer("azure", "westeurope/NC40ads_H100_v5", "H100",
                                                                         3.4)),
                 RunCandidate(connection="local", offer=r.offer)]
        t = r.launched_at or r.created_at
        tried = [RunAttempt(index=i, connection=c.connection, provider=c.offer.provider, offer_id=c.offer.offer_id,
                            gpu=c.offer.gpu, price_per_hour=c.offer.total_per_hour, started_at=t, ended_at=t,
                            outcome=outcome, code=code, message=message)
                 for i, (c, (outcome, code, message)) in enumerate(zip(cands, [
                     ("refused", "InsufficientInstanceCapacity", "We currently do not have sufficient capacity"),
                     ("refused", "OperationNotAllowed", "quota exceeded for standardNCadsH100v5Family"),
                     ("launched", "", "")], strict=True))]
        return r.model_copy(update={"candidates": cands, "candidate_index": 2, "attempts": tried})

    get_store().runs.mutate("org-a", run_id, seed)


def test_the_bare_host_url_opens_the_console(local_host: LocalHost) -> None:
    r = requests.get(local_host.url + "/", allow_redirects=False, timeout=10)
    assert r.status_code == 302 and r.headers["Location"] == "/api/console"
    assert requests.get(local_host.url + "/", timeout=10).url.endswith("/api/console")


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
    assert got["uploadUrl"].endswith("/recover?accept_checkpoint=true")  # the checkpoint accepted from the console
    assert api("GET", f"/api/runs/{run_id}")["state"] == "succeeded"
