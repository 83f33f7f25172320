"""Sweep capacity at a realistic cloud: does every account get swept within its bound, on one instance?

Run through the scale bench: `make bench-scale BENCH_ARGS="--sweep-only"` (or `.venv/bin/python -m
tests.bench.scale_bench --sweep-only [--orgs 10,100,1000,10000] [--before] [--real-clock] [--sample 200]
[--aws-sample 20]`).

Per point (N organizations, one compute connection each, `--active` of them with a watched run), on a real
Azurite:
- the fan-out, run for real: one tick's sends (wall, queue requests); past `--fanout-sample` messages the
  rate measured on that many is extrapolated (said in the output);
- which accounts each of the hour's 12 ticks sweeps (the fan-out's own choice, due_now, on the simulated clock);
- a sample of account sweeps (`--sample`) run for real through the sweep-account code against a cloud whose
  every listing call waits 0.2-0.8 s (two listing calls an account, as AWS lists instances and volumes): each
  sweep's wall time, its thread's CPU time, and its cloud waits. With the simulated clock (the default) the
  waits are counted, not slept: an invocation's time is its measured wall plus its drawn waits. With
  `--real-clock` they are slept, and the sample's sweeps run as the host runs them;
- from those, one instance's hour: every tick's due accounts scheduled on the instance's parallel sweeps
  (BEFORE: the host's 6 queue invocations, one account each; AFTER: MAX_RUNNING invocations x BATCH_THREADS
  accounts), and the worker's CPU (one Python process: one core) for them; a tick fits when both the
  schedule and the CPU end within the interval;
- the real AWS provider against moto (`--aws-sample` accounts): the CPU of one account sweep with its
  provider built (a cache miss) and with it cached.
`--before` measures main's behaviour with the same code: every account every tick, one account a message, no
worker bound, no provider cache, a new boto3 session per provider.
"""

from __future__ import annotations

import heapq
import os
import random
import secrets
import statistics
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from tests.fakes import Cloud, MemoryCompute
from tests.support.clock import FakeClock

LIST_CALLS = 2  # listing calls per account sweep (AWS: DescribeInstances, DescribeVolumes)
LATENCY_S = (0.2, 0.8)
INTERVAL_S = 300
HOST_CONCURRENCY = 6  # batchSize 4 + newBatchThreshold 2 (host.json): queue invocations at once per instance

_waits = threading.local()
REAL_CLOCK = False


def waited() -> float:
    return float(getattr(_waits, "s", 0.0))


def reset_waited() -> None:
    _waits.s = 0.0


class SlowCompute(MemoryCompute):
    """The memory provider whose listing waits like a real cloud's: LIST_CALLS calls of 0.2-0.8 s each."""

    def list_managed(self) -> Iterable[Any]:
        for _ in range(LIST_CALLS):
            wait = random.uniform(*LATENCY_S)
            if REAL_CLOCK:
                time.sleep(wait)
            _waits.s = waited() + wait
        return list(super().list_managed())


@contextmanager
def behaviour(before: bool) -> Iterator[None]:
    """Main's behaviour (before) or this branch's, switched on the same code."""
    from shared.providers.aws import client as aws_client
    from shared.runs import provider_cache
    from shared.services.steps import sweep_account
    from shared.services.timers import sweeper

    saved = (sweeper.TIER_ABOVE, sweeper.SWEEP_BATCH, sweep_account.MAX_RUNNING, provider_cache.get,
             aws_client._shared_session)
    if before:
        sweeper.TIER_ABOVE, sweeper.SWEEP_BATCH = 10**9, 1
        sweep_account._running = threading.BoundedSemaphore(10**6)
        provider_cache.get = lambda key, keep, build: build()[0]  # type: ignore[assignment]
        aws_client._shared_session = lambda: aws_client.sdk.boto3.session.Session()  # type: ignore[assignment]
    try:
        yield
    finally:
        (sweeper.TIER_ABOVE, sweeper.SWEEP_BATCH, sweep_account.MAX_RUNNING, provider_cache.get,
         aws_client._shared_session) = saved
        sweep_account._running = threading.BoundedSemaphore(sweep_account.MAX_RUNNING)


def seed_connections(h: Any, orgs: int, active: int) -> list[str]:
    """orgs organizations with a memory connection each (h.org first) and `active` watched runs among them."""
    from shared.models import RunState
    from shared.security import seal
    from shared.store import get_store

    store = get_store()
    conn, _ = store.connections.get(h.org, "compute:memory") or (None, None)
    assert conn is not None
    names = [h.org] + [f"org-{i:05d}" for i in range(1, orgs)]

    def one(org: str) -> None:
        for attempt in range(5):  # Azurite resets a connection now and then under this load
            try:
                store.connections.put(conn.model_copy(update={"org": org, "sealed": seal({}, aad=f"{org}|compute:memory")}),
                                      None)
                return
            except Exception:
                if attempt == 4:
                    raise
                time.sleep(0.2)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, names[1:]))
    template = None
    for k in range(active):
        org = names[k % orgs]
        if template is None:
            from tests.fakes import training_run

            run_id, _ = training_run(h)
            template, _ = store.runs.get(h.org, run_id)
            continue
        rec = template.model_copy(update={"id": f"r{secrets.token_hex(6)}", "org": org, "state": RunState.training,
                                          "resources": []})
        store.runs.create(rec)
        store.watch.add(org, rec.id)
    return names


def fan_out_cost(sample: int) -> dict[str, Any]:
    """One real fan-out: wall time and accounts sent; extrapolated past `sample` messages."""
    from shared.context import invocation
    from shared.queues import get_queues
    from shared.services.timers import sweeper
    from shared.steps import Step

    ctx = invocation()
    due = len(sweeper.due_now(ctx, sweeper.accounts(ctx)))
    messages = -(-due // sweeper.SWEEP_BATCH)
    cut = messages > sample
    saved = sweeper.FANOUT_MAX_SENDS
    if cut:
        sweeper.FANOUT_MAX_SENDS = sample * sweeper.SWEEP_BATCH
    try:
        started = time.perf_counter()
        out = sweeper.fan_out(ctx)
        wall = time.perf_counter() - started
    finally:
        sweeper.FANOUT_MAX_SENDS = saved
    get_queues().client(Step.sweep_account.value).clear_messages()
    sent_msgs = -(-out["sent"] // sweeper.SWEEP_BATCH)
    full = wall * messages / max(sent_msgs, 1) if cut else wall
    return {"due": due, "messages": messages, "wall_s": full, "extrapolated": cut, "measured_msgs": sent_msgs}


def due_per_tick(ticks: int) -> list[int]:
    from shared import clock
    from shared.context import invocation
    from shared.services.timers import sweeper

    ctx = invocation()
    keys = sweeper.accounts(ctx)
    start = clock.now_ts()
    out = []
    for i in range(ticks):
        clock.set_clock(FakeClock(start + i * INTERVAL_S))
        out.append(len(sweeper.due_now(ctx, keys)))
    clock.set_clock(FakeClock(start))
    return out


def sweep_sample(names: list[str], sample: int) -> list[tuple[float, float, float]]:
    """(wall s, cpu s, cloud wait s) of `sample` account sweeps, run one after another (real clock: as the
    host runs them, HOST_CONCURRENCY at once)."""
    from shared.context import invocation
    from shared.services.steps.sweep_account import sweep_one

    ctx = invocation()
    picked = random.Random(1).sample(names, min(sample, len(names)))

    def one(org: str) -> tuple[float, float, float]:
        reset_waited()
        c0, w0 = time.thread_time(), time.perf_counter()
        sweep_one(ctx, org, "memory", sweep_id=f"b{secrets.token_hex(4)}", dry_run=False)
        wall = time.perf_counter() - w0
        return (wall - waited() if REAL_CLOCK else wall), time.thread_time() - c0, waited()

    if REAL_CLOCK:
        with ThreadPoolExecutor(max_workers=HOST_CONCURRENCY) as pool:
            return list(pool.map(one, picked))
    return [one(org) for org in picked]


def makespan(durations: list[float], slots: int) -> float:
    """Greedy list scheduling of the durations on `slots` parallel sweeps (each starts when one is free)."""
    heap = [0.0] * slots
    for d in durations:
        heapq.heappush(heap, heapq.heappop(heap) + d)
    return max(heap) if heap else 0.0


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else (values[0] if values else 0.0)


def hour(samples: list[tuple[float, float, float]], due: list[int], before: bool,
         fanout_s: float) -> dict[str, Any]:
    """One instance's hour of ticks from the sampled sweeps: the longest tick's schedule and CPU, and the
    invocation p99 (AFTER: an invocation sweeps a batch, BATCH_THREADS at a time)."""
    from shared.services.steps.sweep_account import BATCH_THREADS, MAX_RUNNING
    from shared.services.timers.sweeper import SWEEP_BATCH

    rnd = random.Random(2)
    per_account = [w + c for w, _, c in samples]  # an account's sweep: its own work plus its cloud waits
    cpu = [c for _, c, _ in samples]
    slots = HOST_CONCURRENCY if before else MAX_RUNNING * BATCH_THREADS
    worst = max(due)
    draws = [rnd.choice(per_account) for _ in range(worst)]
    schedule = makespan(draws, slots)
    cpu_s = worst * statistics.mean(cpu)
    if before:
        invocations = per_account
    else:
        invocations = [makespan([rnd.choice(per_account) for _ in range(SWEEP_BATCH)], BATCH_THREADS)
                       for _ in range(400)]
    tick_s = max(schedule, cpu_s) + fanout_s
    return {"worst_due": worst, "schedule_s": schedule, "cpu_s": cpu_s, "tick_s": tick_s,
            "fits": tick_s <= INTERVAL_S, "slots": slots, "p99_s": p99(invocations),
            "cpu_ms": 1000 * statistics.mean(cpu), "acct_s": statistics.mean(per_account)}


def aws_cpu(n: int, before: bool) -> dict[str, float]:
    """CPU of one account sweep with the real AWS provider against moto: the first (provider built) and the
    second (cached; before: built again), over n accounts."""
    from pathlib import Path
    from tempfile import mkdtemp

    from shared.clock import now
    from shared.context import invocation
    from shared.models import ConnectionRecord, ConnectionStatus
    from shared.providers import registry
    from shared.providers.aws.config import AwsConfig
    from shared.security import seal
    from shared.services.steps.sweep_account import sweep_one
    from shared.store import get_store
    from tests.providers.aws.pricing_server import PricingServer
    from tests.providers.aws.rig import moto_ec2_server, new_rig

    pricing = PricingServer().start()
    with moto_ec2_server(Path(mkdtemp(prefix="bench-moto-"))) as url:
        rig = new_rig(url, pricing)
        os.environ["AWS_ENDPOINT_URL"] = url
        config = AwsConfig.model_validate(rig.body())
        store = get_store()
        ctx = invocation()
        orgs = [f"aws-{i:04d}-{secrets.token_hex(2)}" for i in range(n)]
        for org in orgs:
            store.connections.put(ConnectionRecord(
                org=org, slot="compute:aws", provider="aws", status=ConnectionStatus.connected,
                config=registry.public_config(config), sealed=seal(registry.sealed_config(config),
                                                                   aad=f"{org}|compute:aws"),
                saved_at=now()), None)
        first: list[float] = []
        second: list[float] = []
        for org in orgs:
            for out in (first, second):
                c0 = time.thread_time()
                got = sweep_one(ctx, org, "aws", sweep_id=f"a{secrets.token_hex(4)}", dry_run=False)
                out.append(time.thread_time() - c0)
                assert "skipped" not in got, got
        os.environ.pop("AWS_ENDPOINT_URL", None)
    pricing.stop()
    return {"first_ms": 1000 * statistics.mean(first), "warm_ms": 1000 * statistics.mean(second)}


def point(azurite: Any, root: str, orgs: int, args: Any) -> dict[str, Any]:
    """One size, on fresh tables: fan-out, the hour's due accounts, sampled sweeps, one instance's hour."""
    from tests.bench.scale_bench import fresh_tables
    from tests.fakes import install_memory_provider, uninstall_memory_provider

    install_memory_provider(Cloud(), SlowCompute)
    try:
        h = fresh_tables(azurite, root)
        started = time.perf_counter()
        names = seed_connections(h, orgs, args.active)
        seed_s = time.perf_counter() - started
        fan = fan_out_cost(args.fanout_sample)
        due = due_per_tick(12)
        samples = sweep_sample(names, args.sample)
        h.close()
    finally:
        uninstall_memory_provider()
    return {"orgs": orgs, "seed_s": seed_s, "fan": fan, "due": due,
            **hour(samples, due, args.before, fan["wall_s"])}


def report(rows: list[dict[str, Any]], aws: dict[str, float] | None, args: Any) -> None:
    mode = "BEFORE (main's behaviour)" if args.before else "AFTER"
    clock_text = "real clock (waits slept)" if REAL_CLOCK else "simulated clock (waits counted, not slept)"
    print(f"\n== sweep capacity, {mode}: one instance, cloud listing calls {LATENCY_S[0]}-{LATENCY_S[1]} s "
          f"({LIST_CALLS} an account), {clock_text}, {args.active} watched runs")
    print(f"{'orgs':>6} | {'due/tick max':>12} {'min':>5} | fan-out {'s':>7} {'msgs':>6} | account {'s':>5} "
          f"{'cpu ms':>7} | hour's worst tick: {'slots':>5} {'sched s':>8} {'cpu s':>7} {'tick s':>7} | "
          f"{'inv p99 s':>9} | fits {INTERVAL_S} s?")
    for r in rows:
        f = r["fan"]
        print(f"{r['orgs']:>6} | {r['worst_due']:>12} {min(r['due']):>5} | {'':>7} {f['wall_s']:7.1f}"
              f"{'*' if f['extrapolated'] else ' '}{f['messages']:>6} | {'':>7} {r['acct_s']:5.2f} {r['cpu_ms']:7.1f} | "
              f"{'':>18} {r['slots']:>5} {r['schedule_s']:8.1f} {r['cpu_s']:7.1f} {r['tick_s']:7.1f} | "
              f"{r['p99_s']:9.2f} | {'YES' if r['fits'] else 'NO: misses the interval'}")
    if any(r["fan"]["extrapolated"] for r in rows):
        print(f"  * fan-out wall extrapolated from {args.fanout_sample} real sends")
    print("  due/tick: accounts the tick sweeps (hour's 12 ticks); account s: a sweep's own wall plus its cloud "
          "waits; sched s: the worst tick's due accounts on the instance's parallel sweeps; cpu s: their worker "
          "CPU (one core); tick s: max(sched, cpu) + fan-out")
    if aws:
        print(f"  real AWS provider on moto ({args.aws_sample} accounts): sweep CPU {aws['first_ms']:.1f} ms with the "
              f"provider built, {aws['warm_ms']:.1f} ms on the next sweep ({'built again' if args.before else 'cached'})")


def run(azurite: Any, root: str, sizes: list[int], args: Any) -> None:
    global REAL_CLOCK
    REAL_CLOCK = args.real_clock
    with behaviour(args.before):
        rows = []
        for n in sizes:
            rows.append(point(azurite, root, n, args))
            print(f"  sweep capacity: orgs={n} seeded in {rows[-1]['seed_s']:.0f} s", flush=True)
        aws = aws_cpu(args.aws_sample, args.before) if args.aws_sample else None
    report(rows, aws, args)
