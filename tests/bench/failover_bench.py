"""Failover benchmark (issue 37): launch-to-training time with 0, 1 and 3 refusing candidates on the fakes.

Run: .venv/bin/python -m tests.bench.failover_bench  [--repeat 5]

The real function handlers on Azurite (queues drained in-process by the test Harness, on its simulated
clock), the AWS provider's real botocore client against moto in server mode behind the refusing proxy
(tests/providers/aws/refusing_proxy.py), which answers RunInstances of the refused instance types with EC2's
InsufficientInstanceCapacity. Each run lists k refusing candidates before one that launches; the time is
from the launch request until the machine's agent reports `training` (a test-side agent plays the VM).
Reported per k: wall seconds (median of --repeat runs, and the ratio against k = 0), the simulated seconds
the queue delays add (a refusal sends the next candidate at once, so 0 is expected), the step messages
delivered and the AWS requests made.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.azurite import Azurite
    from tests.providers.aws.pricing_server import PricingServer
    from tests.providers.aws.rig import moto_ec2_server

    az = Azurite().start()
    pricing = PricingServer().start()
    try:
        with moto_ec2_server(Path(tempfile.mkdtemp(prefix="failover-bench-"))) as moto_url:
            _bench(az.connection_string, moto_url, pricing, args.repeat)
    finally:
        pricing.stop()
        az.stop()


def _bench(connection: str, moto_url: str, pricing: Any, repeat: int) -> None:
    import logging

    os.environ.update({"AzureWebJobsStorage": connection, "TENSORANT_TABLE_PREFIX": "fb" + secrets.token_hex(4),
                       "TENSORANT_LOCAL_ROOT": tempfile.mkdtemp(prefix="failover-bench-local-"),
                       "TENSORANT_DEPLOYMENT_ID": "fb" + secrets.token_hex(3), "TENSORANT_ALLOW_TEST_MODELS": "1"})
    from shared import queues, settings
    from shared.store import get_store, reset_store
    from tests.harness import Harness
    from tests.providers.aws.refusing_proxy import Refusal, RefusingProxy
    from tests.providers.aws.rig import CallLog, new_rig
    from tests.support.storage import clear_queues, drop_tables

    # moto's unimplemented GetEbsDefaultKmsKeyId is logged (with its traceback) at every connection check.
    logging.disable(logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    settings.reset_settings()
    reset_store()
    queues.reset_queues()
    clear_queues(queues.get_queues())
    rig = new_rig(moto_url, pricing)
    proxy = RefusingProxy(rig.url).start()
    os.environ["AWS_ENDPOINT_URL"] = proxy.url
    os.environ["AWS_ENDPOINT_URL_PRICING"] = pricing.url
    from shared.providers import registry
    from shared.providers.aws.compute import build

    log = CallLog()
    undo = registry.override("aws", factory=lambda config, s: build(config, s, on_api_call=log))
    h = Harness()
    try:
        assert h.save_storage({"kind": "local"})["status"] == "connected"
        conn = h.save_compute("aws", rig.body(workspace_disk_gb=50))
        assert conn["status"] == "connected", conn["checks"]
        offers = sorted(h.ok("GET", "/api/catalog/gpus", params={"provider": "aws"})["items"],
                        key=lambda o: o["total_per_hour"])
        if len(offers) < 4:
            raise SystemExit(f"the recorded AWS catalog has {len(offers)} offers in the zone; 4 are needed")
        project = h.project_and_dataset()
        results: dict[int, dict[str, list[float]]] = {}
        for k in (0, 1, 3):
            refusing = offers[:k]
            proxy.refuse = {o["machine_type"]: Refusal("InsufficientInstanceCapacity") for o in refusing}
            for _ in range(repeat + 1):  # the first of each k warms caches and is not counted
                got = _one(h, project, [*refusing, offers[k]], log)
                if _ > 0:
                    for key, value in got.items():
                        results.setdefault(k, {}).setdefault(key, []).append(value)
        base = statistics.median(results[0]["wall_s"])
        print(f"failover bench: launch -> training on AWS (moto behind the refusing proxy), {repeat} runs each, "
              "median")
        print(f"{'refusing':>9} {'wall s':>8} {'ratio':>6} {'sim s':>6} {'messages':>9} {'AWS calls':>10}")
        for k, r in results.items():
            wall = statistics.median(r["wall_s"])
            print(f"{k:>9} {wall:>8.3f} {wall / base:>6.2f} {statistics.median(r['sim_s']):>6.0f} "
                  f"{statistics.median(r['messages']):>9.0f} {statistics.median(r['aws_calls']):>10.0f}")
        left = [i for res in rig.ec2.describe_instances()["Reservations"] for i in res["Instances"]
                if i["State"]["Name"] not in ("terminated", "shutting-down")]
        print(f"instances left running after the runs were cancelled: {len(left)}")
        drop_tables(get_store())
    finally:
        h.close()
        undo()
        proxy.stop()


def _one(h: Any, project: tuple[str, str], candidates: list[dict[str, Any]], log: Any) -> dict[str, float]:
    pid, dsid = project
    run = h.ok("POST", "/api/runs", token="member", json_body={
        "project_id": pid, "dataset_version_id": dsid, "base_model": "tensorant/smoke-tiny",
        "price_limit_per_hour": 100.0, "runtime_limit_s": 3600,
        "candidates": [{"connection": "aws", "offer_id": o["offer_id"]} for o in candidates]})
    log.take()
    deliveries, sim = h.deliveries, h.clock()
    t0 = time.perf_counter()
    h.ok("POST", f"/api/runs/{run['id']}/launch", token="member", json_body={"confirm": True})
    h.drain()
    h.agent(run["id"]).heartbeat("training", 0.0)
    wall = time.perf_counter() - t0
    got = h.get_run(run["id"])
    assert got["state"] == "training", got["reason"]
    assert [a["outcome"] for a in got["attempts"]] == ["refused"] * (len(candidates) - 1) + ["launched"]
    out = {"wall_s": wall, "sim_s": h.clock() - sim, "messages": float(h.deliveries - deliveries),
           "aws_calls": float(len(log.take()))}
    h.ok("POST", f"/api/runs/{run['id']}/cancel", json_body={"discard": True})
    h.drain()
    return out


if __name__ == "__main__":
    main()
