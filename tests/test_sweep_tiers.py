"""The sweeper at scale: accounts with nothing active swept hourly, spread evenly over the hour by a hash;
active ones (a watched run, or something seen within a day) every tick; sends batched; and a worker runs
at most a few account sweeps at once, deferring the rest, so a slow cloud's sweeps cannot hold every thread."""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import pytest

from shared.context import Context
from shared.models import SweepMessage
from shared.queues import Queues, get_queues
from shared.services.steps import sweep_account
from shared.services.timers import sweeper
from shared.steps import Step
from shared.store import get_store, leases
from tests.fakes import Cloud, training_run
from tests.harness import Harness, smoke_adapter_zip

N_OTHERS = 36


@pytest.fixture
def many(harness: Harness, cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """The harness org's memory connection and N_OTHERS copies in other orgs, tiers on at any count."""
    monkeypatch.setattr(sweeper, "TIER_ABOVE", 0)
    store = get_store()
    conn, _ = store.connections.get(harness.org, "compute:memory") or (None, None)
    assert conn is not None
    for i in range(N_OTHERS):
        store.connections.put(conn.model_copy(update={"org": f"zz-org-{i:02d}"}), None)
    yield sweeper.accounts(harness.ctx)


def due(harness: Harness) -> list[tuple[str, str]]:
    return sweeper.due_now(harness.ctx, sweeper.accounts(harness.ctx))


def test_accounts_with_nothing_active_are_swept_hourly_and_evenly(harness: Harness, many: list[tuple[str, str]]) -> None:
    seen: Counter[tuple[str, str]] = Counter()
    per_tick = []
    for _ in range(sweeper.COLD_EVERY):
        got = due(harness)
        per_tick.append(len(got))
        seen.update(got)
        harness.clock.advance(sweeper.INTERVAL_S)
    assert set(seen) == set(many) and set(seen.values()) == {1}  # each exactly once an hour
    assert max(per_tick) <= 3 * len(many) / sweeper.COLD_EVERY + 2, per_tick  # a hash's share each tick
    assert due(harness) == [k for k in many if sweeper.slot_of(k) == sweeper.slot_of(due(harness)[0])]  # the same slots again


def test_an_active_account_is_swept_every_tick_and_for_a_day_after(harness: Harness, many: list[tuple[str, str]]) -> None:
    mine = (harness.org, "memory")
    run_id, agent = training_run(harness)
    for _ in range(sweeper.COLD_EVERY):
        assert mine in due(harness)  # a watched run in the org
        harness.clock.advance(sweeper.INTERVAL_S)
    out = sweep_account.sweep_one(harness.ctx, harness.org, "memory", sweep_id="s1", dry_run=False)
    assert out["active"] is True  # it saw the watched run and the machine: marked
    agent.train(smoke_adapter_zip())
    assert harness.get_run(run_id)["state"] == "succeeded"
    for _ in range(sweeper.COLD_EVERY):
        assert mine in due(harness)  # ended: still every tick (its run ended within the day)
        harness.clock.advance(sweeper.INTERVAL_S)
    harness.clock.advance(sweeper.ACTIVE_FOR_S)
    quiet = sweep_account.sweep_one(harness.ctx, harness.org, "memory", sweep_id="s2", dry_run=False)
    assert quiet["active"] is False
    ticks = 0
    for _ in range(sweeper.COLD_EVERY):
        ticks += mine in due(harness)
        harness.clock.advance(sweeper.INTERVAL_S)
    assert ticks == 1  # a day later: hourly


def sent_messages() -> list[dict[str, Any]]:
    client = get_queues().client(Step.sweep_account.value)
    out = []
    for m in client.receive_messages(messages_per_page=32, visibility_timeout=60):
        out.append(json.loads(base64.b64decode(m.content)))
        client.delete_message(m)
    return out


def test_sends_are_batched_and_each_account_of_a_batch_is_swept(harness: Harness, many: list[tuple[str, str]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweeper, "TIER_ABOVE", 10_000)  # every account this tick
    assert sweeper.tick(harness.ctx)["sent"] == len(many)
    msgs = sent_messages()
    assert len(msgs) == -(-len(many) // sweeper.SWEEP_BATCH)  # one queue request per batch
    accounts = [(m["org"], m["provider"]) for m in msgs] + [(t["org"], t["provider"]) for m in msgs
                                                             for t in m["batch"]]
    assert sorted(accounts) == many
    msg = SweepMessage.model_validate(msgs[0])
    sweep_account.sweep_account(harness.ctx, msg)
    batch = [(msg.org, msg.provider)] + [(t.org, t.provider) for t in msg.batch]
    assert len(batch) == sweeper.SWEEP_BATCH
    for org, provider in batch:
        lease = leases.take(harness.ctx, sweep_account.lease_name(org, provider), 1)
        assert lease is not None and lease.data.get("sweep") == msg.sweep, (org, lease)
    sweep_account.sweep_account(harness.ctx, msg)  # delivered twice: each account finds its sweep done, nothing acts


def test_a_worker_defers_sweeps_past_its_bound(harness: Harness, many: list[tuple[str, str]]) -> None:
    sent: list[tuple[str, Any, float]] = []

    class Recorder:
        def send(self, queue: Any, body: Any, delay_s: float = 0) -> None:
            sent.append((str(queue), body, delay_s))

    ctx = harness.ctx
    recorded = Context(ctx.settings, ctx.store, cast(Queues, Recorder()))
    msg = SweepMessage(org=harness.org, provider="memory", sweep="s-busy")
    held = [sweep_account._running.acquire(blocking=False) for _ in range(sweep_account.MAX_RUNNING)]
    try:
        assert all(held)
        sweep_account.sweep_account(recorded, msg)  # returns at once: the worker's thread is free again
    finally:
        for _ in held:
            sweep_account._running.release()
    [(queue, body, delay)] = sent
    assert queue == Step.sweep_account.value and body == msg
    assert sweep_account.DEFER_S[0] <= delay <= sweep_account.DEFER_S[1]
    lease = leases.take(ctx, sweep_account.lease_name(harness.org, "memory"), 1)
    assert lease is not None and "sweep" not in lease.data  # nothing was swept
    leases.end(ctx, lease)
    sweep_account.sweep_account(recorded, msg)  # with room: swept
    lease = leases.take(ctx, sweep_account.lease_name(harness.org, "memory"), 1)
    assert lease is not None and lease.data.get("sweep") == "s-busy"
