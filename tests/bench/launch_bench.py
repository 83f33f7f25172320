"""Launch benchmark: N simultaneous launches to `succeeded` on the local provider.

Run: .venv/bin/python -m tests.bench.launch_bench  [--runs 30] [--timeout 600]

The dev host (waitress, queue pollers, no timers) serves the real app on Azurite; the local
provider starts one real agent process per run with the smoke trainer. All drafts are made
first, then every launch is sent at the same moment, each on its own new connection (the
way 30 users clicking at once arrive). Reports: time to all terminal, per-run time to
succeeded (p50/max), connection resets and other transport errors on the launches and the
polling, final states, and leftovers (agent processes still running, ledger resources not
released) after the host stops.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.storage import drop_tables

ROOT = Path(__file__).resolve().parents[2]
TERMINAL_OR_RETAINED = {"succeeded", "failed", "cancelled", "retained"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.azurite import Azurite

    az = Azurite().start()
    try:
        _bench(az.connection_string, args.runs, args.timeout)
    finally:
        az.stop()


def _bench(connection: str, n: int, timeout: float) -> None:
    import logging

    import requests

    from tests.azurite import free_port

    port = free_port()
    os.environ.update({"AzureWebJobsStorage": connection, "TENSORANT_TABLE_PREFIX": "lb" + secrets.token_hex(4),
                       "TENSORANT_LOCAL_ROOT": tempfile.mkdtemp(prefix="launch-bench-"),
                       "TENSORANT_DEPLOYMENT_ID": "lb" + secrets.token_hex(3),
                       "TENSORANT_PUBLIC_URL": f"http://127.0.0.1:{port}",
                       # The control plane's cost, not 30 real trainings on this machine's cores.
                       "TENSORANT_TRAINER_COMMAND": f"{sys.executable} -m machine.trainer.smoke"})
    from shared import queues, settings
    from shared.models import Role
    from shared.providers.base import RunRef
    from shared.providers.local.compute import LocalCompute
    from shared.providers.local.config import LocalConfig
    from shared.security import mint_user_token
    from shared.store import get_store, reset_store
    from tensorant_devhost.host import Host

    settings.reset_settings()
    reset_store()
    queues.reset_queues()
    import function_app

    logging.getLogger("tensorant.devhost").setLevel(logging.WARNING)
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    host = Host(function_app.app, root=ROOT, port=port, load_settings=False, timers=False).start()
    token = mint_user_token("owner@a", "org-a", Role.owner)
    auth = {"Authorization": f"Bearer {token}"}
    errors: Counter[str] = Counter()

    def call(method: str, path: str, session: Any = None, **kw: Any) -> Any:
        headers = {**auth, **kw.pop("headers", {})}
        r = (session or requests).request(method, host.url + path, headers=headers, timeout=60, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json() if r.content else None

    try:
        s = requests.Session()
        # 30 runs created and launched at once: above the default org limits, as an owner sets them.
        call("PUT", "/api/org/limits", s, json={"max_active_runs": max(5, n), "runs_per_minute": max(10, 2 * n)})
        call("PUT", "/api/connections/storage", s, json={"kind": "local"})
        call("PUT", "/api/connections/compute/local", s, json={})
        deadline = time.monotonic() + 60
        while call("GET", "/api/connections/compute/local", s)["status"] == "checking" and time.monotonic() < deadline:
            time.sleep(0.2)
        project = call("POST", "/api/projects", s, json={"name": "bench"})
        lines = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]})
                 for i in range(4)]
        ds = call("POST", f"/api/projects/{project['id']}/datasets", s, data="\n".join(lines).encode(),
                  headers={"Content-Type": "application/x-ndjson"})
        offer = call("GET", "/api/catalog/gpus?provider=local", s)["items"][0]["offer_id"]
        runs = [call("POST", "/api/runs", s, json={
            "project_id": project["id"], "dataset_version_id": ds["id"], "provider": "local", "offer_id": offer,
            "base_model": "tensorant/smoke-tiny", "price_limit_per_hour": 1.0})["id"] for _ in range(n)]

        barrier = threading.Barrier(n)
        launched: dict[str, float] = {}

        def launch(run_id: str) -> None:
            barrier.wait()
            try:
                # A new connection each: Connection: close, as n separate users' browsers would.
                call("POST", f"/api/runs/{run_id}/launch", json={"confirm": True})
                launched[run_id] = time.monotonic()
            except requests.ConnectionError as exc:
                errors["launch: " + ("reset" if "reset" in str(exc).lower() else "connection")] += 1
            except Exception as exc:
                errors[f"launch: {type(exc).__name__}"] += 1

        started = time.monotonic()
        threads = [threading.Thread(target=launch, args=(r,)) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        launch_s = time.monotonic() - started
        done: dict[str, tuple[str, float]] = {}
        deadline = started + timeout
        while len(done) < len(launched) and time.monotonic() < deadline:
            for run_id in launched:
                if run_id in done:
                    continue
                try:
                    state = call("GET", f"/api/runs/{run_id}", s)["state"]
                except requests.ConnectionError:
                    errors["poll: connection"] += 1
                    continue
                if state in TERMINAL_OR_RETAINED:
                    done[run_id] = (state, time.monotonic() - started)
            time.sleep(0.5)
        total_s = time.monotonic() - started
    finally:
        host.stop()
    local = LocalCompute(LocalConfig(), settings.get_settings())
    leftovers = list(local.list_managed())
    for res in leftovers:
        local.release(RunRef(settings.get_settings().deployment_id, res.org, res.run_id), [res])
    states = Counter(state for state, _ in done.values())
    ok_times = sorted(t for state, t in done.values() if state == "succeeded")
    print(f"launch bench: {n} simultaneous launches on the local provider (smoke trainer)")
    print(f"launch requests answered: {len(launched)}/{n} in {launch_s:.1f}s; transport errors: {dict(errors) or 0}")
    print(f"final states: {dict(states)}; not finished in {timeout:.0f}s: {len(launched) - len(done)}")
    if ok_times:
        print(f"time to succeeded: p50 {statistics.median(ok_times):.1f}s, max {ok_times[-1]:.1f}s; "
              f"all done after {total_s:.1f}s")
    print(f"leftovers after the host stopped: {len(leftovers)} agent processes or work "
          "folders the local provider still finds (released above if any)")
    drop_tables(get_store())


if __name__ == "__main__":
    main()
