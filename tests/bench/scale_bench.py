"""Scale bench: the timers and the run list as organizations and runs grow, on Azurite.

Run: make bench-scale   (or .venv/bin/python -m tests.bench.scale_bench [--orgs 10,100,1000,10000]
                         [--runs 100,1000,10000] [--active 10])

First the sweep capacity at a realistic cloud (tests/bench/sweep_capacity.py: does every account get swept
within its bound on one instance? `--sweep-only`, `--no-sweep`, `--before`, `--real-clock`); then
two curves, each point a fresh set of tables on one real Azurite (the state store a user has):
- orgs: N organizations with a compute connection each and 10 runs each, all ended but `--active`
  in all (the same number at every N), so what grows is history and connections, not work;
- runs: one organization with N runs, all ended but `--active`.
For each point, per timer tick and per request: wall time, table requests and response bytes (every
HTTP request the Storage clients send, counted at the transport), cloud calls, queue messages:
- heartbeat-check: one tick (the timer reads the watch index, then each active run);
- sweeper: the timer's fan-out (one sweep-account message per connection), then every account's
  sweep-account invocation, run as the Functions host runs them (6 at a time: batchSize 4 +
  newBatchThreshold 2): the longest invocation, the mean, and the wall time to sweep them all;
- GET /api/runs: the first page (runs curve).
The cloud is the tests' in-memory "memory" provider (instant; a hand-written fake: no emulator
exists for "a cloud"), so what is measured is the control plane's own cost. Printed as ratios
between points, since this 2-core machine is shared and noisy; the goals (issue 26) are printed
next to them.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from tests.support.storage import clear_queues

RUNS_PER_ORG = 10
HOST_CONCURRENCY = 6  # batchSize + newBatchThreshold per queue function and instance (host.json)
FUNCTION_TIMEOUT_S = 300


@contextmanager
def counted() -> Iterator[dict[str, int]]:
    """Every HTTP request the Storage clients send meanwhile, and the bytes of their answers."""
    from azure.core.pipeline.transport import RequestsTransport

    out = {"requests": 0, "bytes": 0, "table": 0, "queue": 0}
    original = RequestsTransport.send

    def counting(self: Any, request: Any, **kw: Any) -> Any:
        resp = original(self, request, **kw)
        out["requests"] += 1
        out["table" if f":{TABLE_PORT}/" in request.url else "queue"] += 1
        try:
            out["bytes"] += len(resp.internal_response.content or b"")
        except Exception:
            pass
        return resp

    RequestsTransport.send = counting  # type: ignore[method-assign]
    try:
        yield out
    finally:
        RequestsTransport.send = original  # type: ignore[method-assign]


TABLE_PORT = 0


def fresh_tables(azurite: Any, root: str) -> Any:
    """New table prefix and clean queues; returns a Harness (org-a, local storage, memory compute)."""
    from shared import queues, settings
    from shared.store import reset_store
    from tests.harness import Harness

    os.environ.update({
        "AzureWebJobsStorage": azurite.connection_string,
        "TENSORANT_TABLE_PREFIX": "b" + secrets.token_hex(4),
        "TENSORANT_LOCAL_ROOT": os.path.join(root, secrets.token_hex(4)),
        "TENSORANT_DEPLOYMENT_ID": "bench",
        "TENSORANT_TRAINER_COMMAND": f"{sys.executable} -m machine.trainer.smoke",
        "TENSORANT_ALLOW_TEST_MODELS": "1",
    })
    settings.reset_settings()
    reset_store()
    queues.reset_queues()
    clear_queues(queues.get_queues())
    h = Harness()
    h.save_storage({"kind": "local"})
    assert h.save_compute("memory", {})["status"] == "connected"
    return h


def seed(h: Any, orgs: int, runs_per_org: int, active: int) -> None:
    """orgs organizations (h.org first) with a compute connection and runs_per_org runs each, all ended
    but `active` (spread over the first orgs), written in batches (one transaction per org and 100 runs)."""
    from shared.ids import newest_first_id
    from shared.models import RunRecord, RunState
    from shared.security import seal
    from shared.store import get_store
    from shared.store.tables import _entity
    from tests.fakes import training_run

    store = get_store()
    live_id, _ = training_run(h)  # one real launch: a template record with every field set
    template, _ = store.runs.get(h.org, live_id)
    conn, _ = store.connections.get(h.org, "compute:memory") or (None, None)
    assert conn is not None
    names = [h.org] + [f"org-{i:05d}" for i in range(1, orgs)]
    far = template.deadlines.model_copy(update={"heartbeat_by": None, "runtime_by": None, "provisioning_by": None})

    def one_org(i: int) -> None:
        org = names[i]
        if org != h.org:
            sealed = seal({}, aad=f"{org}|compute:memory")
            store.connections.put(conn.model_copy(update={"org": org, "sealed": sealed}), None)
        entities = []
        n_active = sum(1 for k in range(active) if k % orgs == i) - (1 if org == h.org else 0)
        for k in range(runs_per_org - (1 if org == h.org else 0)):
            live = k < n_active
            rec: RunRecord = template.model_copy(update={
                "id": newest_first_id("r"), "org": org,
                "state": RunState.training if live else RunState.succeeded,
                "resources": [] if live else template.resources, "deadlines": far})
            entities.append(("create", _entity(org, rec.id, rec.model_dump(mode="json"),
                                               {"state": rec.state.value, "project": rec.project_id})))
            if live:
                store.watch.add(org, rec.id)
        client = store.table("runs").client
        for start in range(0, len(entities), 100):
            client.submit_transaction(entities[start:start + 100])

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one_org, range(orgs)))
    store.runs.build_watch_index()  # the marker: a deployment whose index exists (no scan in the tick)


def timed(fn: Callable[[], Any]) -> tuple[Any, float, dict[str, int]]:
    with counted() as c:
        started = time.perf_counter()
        out = fn()
        wall = time.perf_counter() - started
    return out, wall, dict(c)


def sweep_accounts(cloud: Any) -> dict[str, Any]:
    """Take every sweep-account message and run its step, HOST_CONCURRENCY at a time, as the host does."""
    from shared.context import invocation
    from shared.models import SweepMessage
    from shared.queues import get_queues
    from shared.services.steps.sweep_account import sweep_account
    from shared.steps import Step

    ctx = invocation()
    client = get_queues().client(Step.sweep_account.value)
    msgs = []
    while True:
        got = list(client.receive_messages(messages_per_page=32, visibility_timeout=600))
        if not got:
            break
        msgs += got
    walls: list[float] = []

    def one(m: Any) -> None:
        body = SweepMessage.model_validate(json.loads(base64.b64decode(m.content)))
        started = time.perf_counter()
        sweep_account(ctx, body)
        walls.append(time.perf_counter() - started)

    calls_before = len(cloud.calls) if hasattr(cloud, "calls") else 0
    with counted() as c:
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=HOST_CONCURRENCY) as pool:
            list(pool.map(one, msgs))
        total = time.perf_counter() - started
    return {"accounts": len(msgs), "max_s": max(walls, default=0.0), "mean_s": statistics.mean(walls) if walls else 0.0,
            "all_s": total, "requests": c["requests"], "per_account_req": c["requests"] / max(len(msgs), 1),
            "cloud_calls": (len(cloud.calls) - calls_before) if hasattr(cloud, "calls") else -1}


def point(azurite: Any, root: str, orgs: int, runs_per_org: int, active: int) -> dict[str, Any]:
    from shared.context import invocation
    from shared.services.timers import heartbeat_check, sweeper
    from tests.fakes import Cloud, install_memory_provider, uninstall_memory_provider

    cloud = Cloud()
    install_memory_provider(cloud)
    try:
        h = fresh_tables(azurite, root)
        started = time.perf_counter()
        seed(h, orgs, runs_per_org, active)
        seed_s = time.perf_counter() - started
        ctx = invocation()
        heartbeat_check.check_all(ctx)  # warm: first tick, clients built
        hb, hb_s, hb_c = timed(lambda: heartbeat_check.check_all(ctx))
        fan, fan_s, fan_c = timed(lambda: sweeper.tick(ctx))
        accounts = sweep_accounts(cloud)
        page, page_s, page_c = timed(lambda: h.ok("GET", "/api/runs", params={"limit": "50"}))
        h.close()
        return {"orgs": orgs, "runs": orgs * runs_per_org, "active": hb["watched"], "seed_s": seed_s,
                "hb_s": hb_s, "hb_req": hb_c["requests"], "hb_bytes": hb_c["bytes"],
                "fan_s": fan_s, "fan_req": fan_c["requests"], "sent": fan["sent"],
                "acc": accounts, "page_s": page_s, "page_req": page_c["requests"], "page_bytes": page_c["bytes"],
                "page_items": len(page["items"])}
    finally:
        uninstall_memory_provider()


def ratio(a: float, b: float) -> str:
    return f"x{b / a:.2f}" if a > 0 else "-"


def report(title: str, rows: list[dict[str, Any]], key: str) -> None:
    print(f"\n== {title}")
    print(f"{key:>6} {'runs':>7} {'active':>6} | heartbeat tick: {'s':>6} {'req':>5} {'KB':>7} | sweeper fan-out: "
          f"{'s':>6} {'req':>6} {'sent':>6} | account sweeps (6 at once): {'max s':>6} {'mean s':>6} {'all s':>7} "
          f"{'req/acct':>8} | GET /api/runs page 1: {'s':>6} {'req':>4} {'KB':>6}")
    for r in rows:
        a = r["acc"]
        print(f"{r[key]:>6} {r['runs']:>7} {r['active']:>6} | {'':>15} {r['hb_s']:6.3f} {r['hb_req']:>5} "
              f"{r['hb_bytes'] / 1024:7.1f} | {'':>16} {r['fan_s']:6.2f} {r['fan_req']:>6} {r['sent']:>6} | "
              f"{'':>27} {a['max_s']:6.3f} {a['mean_s']:6.3f} {a['all_s']:7.1f} {a['per_account_req']:8.1f} | "
              f"{'':>21} {r['page_s']:6.3f} {r['page_req']:>4} {r['page_bytes'] / 1024:6.1f}")
    first = rows[0]
    for r in rows[1:]:
        print(f"{key} x{r[key] / first[key]:g}: heartbeat tick wall {ratio(first['hb_s'], r['hb_s'])}, requests "
              f"{ratio(first['hb_req'], r['hb_req'])}; longest account sweep {ratio(first['acc']['max_s'], r['acc']['max_s'])}, "
              f"requests per account {ratio(first['acc']['per_account_req'], r['acc']['per_account_req'])}; "
              f"fan-out wall {ratio(first['fan_s'], r['fan_s'])} (sends grow with connections); runs page 1 wall "
              f"{ratio(first['page_s'], r['page_s'])}, requests {ratio(first['page_req'], r['page_req'])}")
    longest = max(max(r["acc"]["max_s"], r["hb_s"], r["fan_s"]) for r in rows)
    print(f"longest timer or step invocation: {longest:.2f} s = {longest / FUNCTION_TIMEOUT_S:.3f} of functionTimeout "
          f"({FUNCTION_TIMEOUT_S} s; goal < 1/3)")
    for r in rows:
        if r["acc"]["accounts"]:
            print(f"{r[key]} {key}: every account swept in {r['acc']['all_s']:.1f} s on one instance "
                  f"({HOST_CONCURRENCY} at once) of the sweeper's {sweeper_interval()} s interval")


def sweeper_interval() -> int:
    from shared.services.timers.sweeper import INTERVAL_S

    return INTERVAL_S


def main(argv: list[str] | None = None) -> None:
    global TABLE_PORT
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--orgs", default="10,100,1000,10000")
    p.add_argument("--runs", default="100,1000,10000")
    p.add_argument("--active", type=int, default=10)
    # The sweep capacity at a realistic cloud (tests/bench/sweep_capacity.py).
    p.add_argument("--sweep-only", action="store_true", help="only the sweep capacity curve")
    p.add_argument("--no-sweep", action="store_true", help="skip the sweep capacity curve")
    p.add_argument("--before", action="store_true", help="main's sweeper behaviour (no tiers, batches, cache)")
    p.add_argument("--real-clock", action="store_true", help="cloud waits slept, not counted")
    p.add_argument("--sample", type=int, default=150, help="account sweeps run for real per size")
    p.add_argument("--aws-sample", type=int, default=20, help="accounts swept with the real AWS provider on moto")
    p.add_argument("--fanout-sample", type=int, default=1500, help="real sends per fan-out before extrapolating")
    args = p.parse_args(argv)
    import logging

    import function_app  # noqa: F401  (the app's logging set up first, then quieted below)
    from shared import clock

    for name in ("tensorant", "azure"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from tests.azurite import Azurite

    t0 = time.time()
    clock.set_clock(lambda: t0)  # simulated: nothing ages during the bench
    azurite = Azurite().start()
    TABLE_PORT = azurite.ports[2]
    root = tempfile.mkdtemp(prefix="scale-bench-")
    print("scale bench: Azurite (in memory) + the in-memory cloud; wall times on a shared 2-core machine: read the "
          "ratios")
    try:
        if not args.no_sweep:
            from tests.bench import sweep_capacity

            sweep_capacity.run(azurite, root, [int(x) for x in args.orgs.split(",") if x], args)
            if args.sweep_only:
                return
        orgs_rows = []
        for n in [int(x) for x in args.orgs.split(",") if x]:
            orgs_rows.append(point(azurite, root, n, RUNS_PER_ORG, args.active))
            print(f"  orgs={n}: seeded in {orgs_rows[-1]['seed_s']:.0f} s", flush=True)
        runs_rows = []
        for n in [int(x) for x in args.runs.split(",") if x]:
            runs_rows.append(point(azurite, root, 1, n, args.active))
            print(f"  runs={n}: seeded in {runs_rows[-1]['seed_s']:.0f} s", flush=True)
        if orgs_rows:
            report(f"{RUNS_PER_ORG} runs per org, {args.active} active in all (goal: per-tick cost flat within 2x "
                   "from 10 to 10k orgs)", orgs_rows, "orgs")
        if runs_rows:
            report(f"one org, {args.active} active (goal: page 1 of GET /api/runs within 2x from 100 to 10k runs)",
                   runs_rows, "runs")
    finally:
        azurite.stop()
        clock.set_clock(None)


if __name__ == "__main__":
    main()
