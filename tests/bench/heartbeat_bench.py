"""Heartbeat benchmark: heartbeats/s and p99 latency at 1, 8 and 32 clients
against the dev host (waitress) serving the real app on Azurite, with Azurite's own
sequential upsert rate measured in the same run as the yardstick.

Run: .venv/bin/python -m tests.bench.heartbeat_bench  [--seconds 4] [--clients 1,8,32] [--logs 0]

Each client is one agent: its own run (in `training`, made through the real handlers on
the in-memory provider), one keep-alive connection, heartbeats back to back. The clients
run in a separate process (threads), so they do not share the host's interpreter lock.
A second pass puts every client on ONE run (contention): lost races must answer 409 or be
retried, never 5xx. Goal: 8 clients >= 0.8 x Azurite's sequential upsert rate.

The dev host serves with --workers HTTP processes (default 2, as FUNCTIONS_WORKER_PROCESS_COUNT
spreads the real host's invocations): one process is bound by its interpreter lock at about
3 ms of Azure SDK CPU per table call.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.storage import drop_tables

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- client process


def _client_main() -> None:
    """Reads {port, targets: [[run_id, token]...], seconds, logs} on stdin; prints the results."""
    spec = json.loads(sys.stdin.read())
    stop_at = time.monotonic() + float(spec["seconds"])
    results: list[tuple[list[float], Counter[int]]] = []
    lock = threading.Lock()

    def connect() -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("127.0.0.1", int(spec["port"]), timeout=30)
        conn.connect()
        # http.client sends the headers and the body in two writes: without this the client's
        # Nagle waits for the server's delayed ACK (~40 ms) on every keep-alive request.
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def agent(run_id: str, token: str) -> None:
        conn = connect()
        took: list[float] = []
        codes: Counter[int] = Counter()
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            body = json.dumps({"phase": "training", "progress": 0.5,
                               "logs": [f"step={n} loss=1.0 lr=0.0002"] * int(spec["logs"])})
            start = time.perf_counter()
            try:
                conn.request("POST", f"/api/agent/runs/{run_id}/heartbeat", body=body,
                             headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                codes[r.status] += 1
            except (OSError, http.client.HTTPException):
                codes[0] += 1  # a reset or a dropped connection
                conn.close()
                conn = connect()
            took.append(time.perf_counter() - start)
        conn.close()
        with lock:
            results.append((took, codes))

    threads = [threading.Thread(target=agent, args=tuple(t)) for t in spec["targets"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = [x for r in results for x in r[0]]
    codes = sum((r[1] for r in results), Counter())
    print(json.dumps({"latencies": took, "codes": {str(k): v for k, v in codes.items()}}))


def run_clients(port: int, targets: list[tuple[str, str]], seconds: float, logs: int) -> dict[str, Any]:
    spec = {"port": port, "targets": targets, "seconds": seconds, "logs": logs}
    out = subprocess.run([sys.executable, "-m", "tests.bench.heartbeat_bench", "--client"], input=json.dumps(spec),
                         capture_output=True, text=True, cwd=ROOT, check=True, timeout=seconds + 120)
    data = json.loads(out.stdout)
    lat = sorted(data["latencies"])
    total = len(lat)
    p99 = lat[min(total - 1, int(total * 0.99))] if lat else 0.0
    return {"n": total, "rate": total / seconds, "p50_ms": statistics.median(lat) * 1000 if lat else 0.0,
            "p99_ms": p99 * 1000, "codes": data["codes"]}


# ---------------------------------------------------------------- the yardstick


def azurite_upsert_rate(connection: str, seconds: float, *, app_transport: bool) -> float:
    """Sequential upserts of a run-sized entity (one JSON property of about 2 KB), as fast as one caller
    goes: through the SDK's default transport (what any Azure Tables client gets), or through the app's own
    (shared/storage_transport.py: faster, so a stricter yardstick)."""
    from azure.data.tables import TableServiceClient, UpdateMode

    from shared.storage_transport import storage_client_kwargs

    service = TableServiceClient.from_connection_string(connection, **(storage_client_kwargs() if app_transport else {}))
    table = service.create_table_if_not_exists("bench" + secrets.token_hex(4))
    data = json.dumps({"filler": "x" * 2000})
    n = 0
    stop_at = time.monotonic() + seconds
    started = time.perf_counter()
    while time.monotonic() < stop_at:
        table.upsert_entity({"PartitionKey": "org", "RowKey": f"r{n % 32}", "data": data, "state": "training"},
                            mode=UpdateMode.REPLACE)
        n += 1
    rate = n / (time.perf_counter() - started)
    service.delete_table(table.table_name)
    return rate


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--logs", type=int, default=0, help="log lines per heartbeat (each chunk is one more write)")
    parser.add_argument("--workers", type=int, default=2,
                        help="dev host processes serving HTTP (FUNCTIONS_WORKER_PROCESS_COUNT); 1 = one interpreter")
    args = parser.parse_args()
    if args.client:
        _client_main()
        return
    sys.path.insert(0, str(ROOT))
    from tests.azurite import Azurite

    az = Azurite().start()
    try:
        _bench(az.connection_string, args)
    finally:
        az.stop()


def _bench(connection: str, args: argparse.Namespace) -> None:
    import tempfile

    env = {"AzureWebJobsStorage": connection, "TENSORANT_TABLE_PREFIX": "hb" + secrets.token_hex(4),
           "TENSORANT_LOCAL_ROOT": tempfile.mkdtemp(prefix="hb-bench-"), "TENSORANT_DEPLOYMENT_ID": "bench",
           # The clients' runs use the smoke model on the in-memory provider, as the test suite's do.
           "TENSORANT_ALLOW_TEST_MODELS": "1"}
    os.environ.update(env)
    from shared import queues, settings
    from shared.store import get_store, reset_store
    from tensorant_devhost.host import Host
    from tests import fakes
    from tests.harness import Harness, lift_quotas

    settings.reset_settings()
    reset_store()
    queues.reset_queues()
    counts = [int(c) for c in args.clients.split(",")]
    cloud = fakes.Cloud()
    fakes.install_memory_provider(cloud)
    h = Harness()
    try:
        h.save_storage({"kind": "local"})
        h.save_compute("memory", {})
        lift_quotas(h.org)  # 32 runs at once
        targets: list[tuple[str, str]] = []
        for _ in range(max(counts)):
            run_id = h.create_run("memory", "mem-a10")
            h.launch(run_id)
            agent = h.agent(run_id)
            agent.heartbeat("training", 0.1)
            targets.append((run_id, agent.token))
    finally:
        h.close()  # the real clock again: the host below serves in real time

    import logging

    import function_app

    logging.getLogger("tensorant.devhost").setLevel(logging.WARNING)  # a line per invocation otherwise
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "task queue depth": the point of 32 clients

    host = Host(function_app.app, root=ROOT, port=0, load_settings=False, queues=False, timers=False,
                http_workers=args.workers).start()
    try:
        run_clients(host.port, targets[:1], 1.0, args.logs)  # warm-up: imports, connections, table creation
        print(f"heartbeat bench: {args.workers} HTTP worker process(es), {args.seconds:.0f} s per point, "
              f"{args.logs} log lines per heartbeat; Azurite's "
              "sequential upsert rate measured just before each point (this machine's speed drifts), through the "
              "SDK's default transport (sdk) and through the app's faster one (app)")
        print(f"{'clients':>8} {'runs':>5} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'cpu ms':>7} {'sdk/s':>7} "
              f"{'x sdk':>6} {'app/s':>7} {'x app':>6}  answers")
        ratios: dict[int, tuple[float, float]] = {}
        for n, one_run in [(n, False) for n in counts] + [(n, True) for n in counts[1:]]:
            sdk = azurite_upsert_rate(connection, args.seconds / 2, app_transport=False)
            app = azurite_upsert_rate(connection, args.seconds / 2, app_transport=True)
            cpu = time.process_time()
            r = run_clients(host.port, [targets[0]] * n if one_run else targets[:n], args.seconds, args.logs)
            # CPU per request of this process, when it serves them all (one HTTP worker).
            cpu_ms = (time.process_time() - cpu) * 1000 / max(1, r["n"]) if args.workers == 1 else float("nan")
            if not one_run:
                ratios[n] = (r["rate"] / sdk, r["rate"] / app)
            print(f"{n:>8} {1 if one_run else n:>5} {r['rate']:>8.0f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
                  f"{cpu_ms:>7.2f} {sdk:>7.0f} {r['rate'] / sdk:>6.2f} {app:>7.0f} {r['rate'] / app:>6.2f}  "
                  f"{r['codes']}" + ("  (all on one run)" if one_run else ""))
        if 8 in ratios:
            x_sdk, x_app = ratios[8]
            verdict = "meets" if x_sdk >= 0.8 else "MISSES"
            print(f"8 clients / Azurite upserts = {x_sdk:.2f} through the SDK's default transport ({verdict} the 0.8 "
                  f"goal), {x_app:.2f} through the app's transport")
    finally:
        host.stop()
        drop_tables(get_store())
        fakes.uninstall_memory_provider()


if __name__ == "__main__":
    main()
