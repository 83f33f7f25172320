"""Control-plane overhead of a zero-length trial on the local host: launch -> succeeded,
in total and per queue hop (from the run's own transition events).

Run: python -m tests.bench.overhead_bench [--runs 5]
It starts its own Azurite and local host; the smoke trainer runs zero steps, so what is
measured is the control plane (queues, tables, agent start, verification, release).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests

from tests.azurite import Azurite, free_port

ROOT = Path(__file__).resolve().parents[2]
HOPS = [
    ("launch queue -> launch step", "draft -> queued", "queued -> provisioning"),
    ("launch step + agent start -> first heartbeat", "queued -> provisioning", "provisioning -> preparing"),
    ("agent: dataset, trainer, export, complete", "provisioning -> preparing", "exporting -> verifying"),
    ("verify-adapter queue + step", "exporting -> verifying", "verifying -> releasing"),
    ("release queue + step (confirmed)", "verifying -> releasing", "releasing -> succeeded"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    az = Azurite().start()
    port = free_port()
    os.environ.update({
        "AzureWebJobsStorage": az.connection_string, "TENSORANT_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "TENSORANT_LOCAL_ROOT": tempfile.mkdtemp(prefix="tensorant-bench-"), "TENSORANT_TABLE_PREFIX": "bench",
        "TENSORANT_SMOKE_STEPS": "0",
    })
    import function_app
    from shared import queues
    from shared.models import Role
    from shared.security import mint_user_token
    from tensorant_devhost.host import Host
    from tensorant_devhost.invocation import notify

    host = Host(function_app.app, root=ROOT, port=port, load_settings=False, timers=False).start()
    s = requests.Session()
    s.headers["Authorization"] = "Bearer " + mint_user_token("bench", "org-bench", Role.owner)
    url = host.url + "/api"
    try:
        s.put(f"{url}/connections/storage", json={"kind": "local"}).raise_for_status()
        s.put(f"{url}/connections/compute/local", json={}).raise_for_status()
        while s.get(f"{url}/connections/compute/local").json()["status"] == "checking":
            time.sleep(0.1)
        project = s.post(f"{url}/projects", json={"name": "bench"}).json()["id"]
        line = json.dumps({"text": "hello"})
        ds = s.post(f"{url}/projects/{project}/datasets", data=line.encode()).json()["id"]
        for wake in (False, True):
            if wake:
                queues.configure(on_send=[notify])
            measure(s, url, project, ds, args.runs,
                    "woken on send (make run)" if wake else "polling only (host.json maxPollingInterval)")
    finally:
        host.stop()
        az.stop()


def measure(s: requests.Session, url: str, project: str, ds: str, runs: int, label: str) -> None:
    totals: list[float] = []
    hops: dict[str, list[float]] = {name: [] for name, _, _ in HOPS}
    for _ in range(runs):
        run = s.post(f"{url}/runs", json={"project_id": project, "dataset_version_id": ds, "provider": "local",
                                         "offer_id": "local-smoke", "base_model": "tensorant/smoke-tiny",
                                         "price_limit_per_hour": 1}).json()
        t0 = time.perf_counter()
        s.post(f"{url}/runs/{run['id']}/launch", json={"confirm": True}).raise_for_status()
        while (r := s.get(f"{url}/runs/{run['id']}").json())["state"] not in ("succeeded", "failed", "retained"):
            time.sleep(0.05)
        totals.append(time.perf_counter() - t0)
        assert r["state"] == "succeeded", r
        at = {e["message"].split(":")[0]: datetime.fromisoformat(e["at"]) for e in r["events"]
              if e["kind"] == "transition"}
        for name, a, b in HOPS:
            hops[name].append((at[b] - at[a]).total_seconds())
    total = statistics.median(totals)
    print(f"zero-length trial, {label}: launch -> succeeded median {total:.2f} s over {runs} runs "
          f"(min {min(totals):.2f}, max {max(totals):.2f})")
    for name, values in hops.items():
        med = statistics.median(values)
        print(f"  {name:48s} {med:6.2f} s  ({med / total:5.1%} of total)")


if __name__ == "__main__":
    main()
