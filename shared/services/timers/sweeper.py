"""The sweeper timer: fans out one sweep-account message per compute connection, the Functions way.

The timer itself touches no cloud: it lists the compute connections (the connections table, paged),
and sends each one a sweep-account message (shared/services/steps/sweep_account.py does the sweep of
one account, within its own bound and under its own lease). So a tick's cost grows with the
connections, and each account's sweep is one short invocation the host can scale out, retry and
poison on its own; a slow or broken account delays nobody else.

No account starves: the sends start after the last account the previous fan-out reached (a cursor
kept on the fan-out's lease, `sweep-fanout`), so a fan-out cut short by its budget (FANOUT_BUDGET_S)
or by the host is continued by the next tick, not restarted at the top of the alphabet. With many
connections the messages are spread over the tick's interval (a visibility delay each), so the
workers and the clouds' list APIs see a steady trickle, not a burst every five minutes.

Tiers, so 10,000 accounts fit one instance's interval: an account is swept every tick while its org has a
watched run (the watch index) or its sweep saw a watched run or a listed resource within the last day (the
active marks, shared/services/steps/sweep_account.mark_active); every other account once an hour, in the tick
its hash picks (COLD_EVERY ticks apart, so each tick gets an even share of them). Below TIER_ABOVE accounts
every account is swept every tick. Bounds (docs/scale.md, "The sweep's cost model"): an active account is
swept within one interval, any other within COLD_EVERY intervals (an hour) of the last, or one hour more when
a fan-out was cut short (the rest of its tick's share waits for the same tick of the next hour).

Sends are batched: one message carries up to SWEEP_BATCH accounts (one queue request per batch), which the
sweep-account invocation sweeps a few at a time on its own threads.

An admin's sweep (POST /api/platform/sweep) is the same fan-out with `report`, over every account: each
account's findings are kept under the sweep's id (the `sweeps` table) for GET /api/platform/sweeps/{id}.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shared import metrics
from shared.clock import now, now_ts
from shared.context import Context
from shared.errors import NotFound
from shared.log import get_logger
from shared.models import ConnectionStatus, SweepMessage, SweepTarget
from shared.runs.org_backends import connection_of_slot, provider_of
from shared.steps import Step
from shared.store import leases

# The timer's schedule is every 5 minutes (functions/sweeper.py): messages are spread over most of it.
INTERVAL_S = 300
SPREAD_S = 240
# Below this many connections every message goes at once (a spread would only delay them).
SPREAD_ABOVE = 100
# The fan-out stops sending after this long (well under functionTimeout), or after this many sends;
# the cursor says where the next tick goes on. Sends run SEND_THREADS at a time (one HTTP request each).
FANOUT_BUDGET_S = 90
FANOUT_MAX_SENDS = 20_000
SEND_THREADS = 16
FANOUT_LEASE = "sweep-fanout"
# Findings kept per account in an admin sweep's report (one table property stays under its 32K limit).
REPORT_FINDINGS = 50
# Accounts per sweep-account message (SweepMessage.batch holds the rest of a batch).
SWEEP_BATCH = 8
# Tiers: an account neither active nor in an org with a watched run is swept every COLD_EVERY ticks (hourly);
# below TIER_ABOVE accounts every account is swept every tick. ACTIVE_FOR_S: how long a sweep's active mark lasts.
COLD_EVERY = 12
TIER_ABOVE = 200
ACTIVE_FOR_S = 24 * 3600


def new_sweep_id() -> str:
    return f"s{now().strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"


def accounts(ctx: Context) -> list[tuple[str, str]]:
    """(org, connection name) of every compute connection that can be swept, in key order: each named
    connection (`aws/us-west-2`) is an account of its own, swept apart from the default (`aws`)."""
    out = set()
    for conn in ctx.store.connections.all_orgs():
        if conn.slot.startswith("compute:") and conn.status != ConnectionStatus.checking:
            out.add((conn.org, connection_of_slot(conn.slot)))
    return sorted(out)


def rotated(keys: list[tuple[str, str]], cursor: Any) -> list[tuple[str, str]]:
    """keys starting after `cursor` (the last one the previous fan-out sent), wrapping around."""
    if not cursor or not isinstance(cursor, list) or len(cursor) != 2:
        return keys
    after = (str(cursor[0]), str(cursor[1]))
    start = next((i for i, k in enumerate(keys) if k > after), 0)
    return keys[start:] + keys[:start]


def fan_out(ctx: Context, *, dry_run: bool = False, report: bool = False, sweep_id: str | None = None) -> dict[str, Any]:
    """Send one sweep-account message per compute connection; returns what was sent."""
    sweep_id = sweep_id or new_sweep_id()
    lease = None if report else leases.take(ctx, FANOUT_LEASE, FANOUT_BUDGET_S + 30)
    if not report and lease is None:
        get_logger().info("sweep fan-out skipped: another fan-out is sending")
        return {"sweep_id": sweep_id, "accounts": 0, "sent": 0, "skipped": "another fan-out is sending"}
    keys = accounts(ctx)
    due = keys if report else due_now(ctx, keys)
    order = due if report else rotated(due, lease.data.get("cursor") if lease else None)
    if report:
        ctx.store.table("sweeps").upsert(sweep_id, "~", {"dry_run": dry_run, "accounts": len(order),
                                                          "at": now().isoformat()})
    sent = _send(ctx, order, sweep_id, dry_run=dry_run, report=report)
    if lease is not None:
        # The cursor: the last account sent. A full fan-out leaves it where it was (next tick starts
        # at the same place: every account once per interval); a cut one, where it stopped.
        cursor = list(order[sent - 1]) if 0 < sent < len(order) else lease.data.get("cursor")
        leases.end(ctx, lease, cursor=cursor, sweep=sweep_id, sent=sent, accounts=len(order), at=now_ts())
    stats = {"sweep_id": sweep_id, "dry_run": dry_run, "accounts": len(order), "sent": sent,
             **({} if report else {"connections": len(keys)})}
    get_logger().info("sweep fanned out", extra=stats)
    return stats


def slot_of(key: tuple[str, str]) -> int:
    """The tick (of COLD_EVERY) in which an account that is not active is swept: a stable hash, so the
    accounts spread evenly over the hour and each keeps its own tick."""
    return int.from_bytes(hashlib.sha256(f"{key[0]}~{key[1]}".encode()).digest()[:4], "big") % COLD_EVERY


# The sweeps table's partition of the accounts marked active (sweep_account.mark_active writes them).
ACTIVE_PARTITION = "~active"


def active_accounts(ctx: Context) -> tuple[set[str], set[tuple[str, str]]]:
    """The orgs with a watched run (the watch index: what is active now) and the accounts whose sweep saw
    something within ACTIVE_FOR_S (their marks). Both reads grow with what is active, not with every account."""
    store = ctx.store
    orgs = {org for org, _ in store.watch.ids()}
    rows = store.table("sweeps").query("PartitionKey eq @p and at gt @t", p=ACTIVE_PARTITION,
                                       t=now_ts() - ACTIVE_FOR_S)
    return orgs, {(str(d["org"]), str(d["provider"])) for d, _ in rows}


def due_now(ctx: Context, keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The accounts this tick sweeps (see the module docstring), in key order."""
    if len(keys) <= TIER_ABOVE:
        return keys
    orgs, marked = active_accounts(ctx)
    tick = int(now_ts() // INTERVAL_S) % COLD_EVERY
    return [k for k in keys if k[0] in orgs or k in marked or slot_of(k) == tick]


def _named(name: str) -> str:
    """A message's `connection`: the name of a named connection, "" for a provider's default."""
    return name if name != provider_of(name) else ""


def _send(ctx: Context, order: list[tuple[str, str]], sweep_id: str, *, dry_run: bool, report: bool) -> int:
    """Send in order, SWEEP_BATCH accounts a message, until the budget is spent; returns how many accounts
    were sent (a prefix of order)."""
    n = len(order)
    batches = [order[i:i + SWEEP_BATCH] for i in range(0, min(n, FANOUT_MAX_SENDS), SWEEP_BATCH)]
    spread = SPREAD_S if n > SPREAD_ABOVE and not report else 0
    until = now_ts() + FANOUT_BUDGET_S
    queues = ctx.queues

    def one(i: int) -> int:
        if now_ts() > until:
            return 0
        batch = batches[i][:max(0, FANOUT_MAX_SENDS - i * SWEEP_BATCH)]
        (org, name), rest = batch[0], batch[1:]
        msg = SweepMessage(org=org, provider=provider_of(name), connection=_named(name), sweep=sweep_id,
                           dry_run=dry_run, report=report,
                           batch=[SweepTarget(org=o, provider=provider_of(n), connection=_named(n)) for o, n in rest])
        queues.send(Step.sweep_account, msg, delay_s=spread * i / len(batches) if spread else 0)
        return len(batch)


    if len(batches) <= 1:
        done = [one(i) for i in range(len(batches))]
    else:
        with ThreadPoolExecutor(max_workers=min(SEND_THREADS, len(batches))) as pool:
            done = list(pool.map(one, range(len(batches))))
    # The prefix that was sent (a send after the budget is skipped, and so is everything after it).
    sent = 0
    for count in done:
        if not count:
            break
        sent += count
    return sent


def record_report(ctx: Context, msg: SweepMessage, out: dict[str, Any]) -> None:
    """Keep one account's findings under its admin sweep's id."""
    findings = out.get("findings", [])
    name = msg.connection or msg.provider
    row = {"org": msg.org, "provider": name, "at": now().isoformat(), "count": len(findings),
           "listed": out.get("listed", 0), "runs_read": out.get("runs_read", 0),
           "findings": findings[:REPORT_FINDINGS], **({"skipped": out["skipped"]} if out.get("skipped") else {})}
    ctx.store.table("sweeps").upsert(msg.sweep, f"{msg.org}~{name.replace('/', '|')}",
                                       json.loads(json.dumps(row, default=str)))


def report(ctx: Context, sweep_id: str) -> dict[str, Any]:
    """An admin sweep's progress and findings so far."""
    rows = list(ctx.store.table("sweeps").query("PartitionKey eq @s", s=sweep_id))
    head = next((d for d, _ in rows if "accounts" in d and "org" not in d), None)
    if head is None:
        raise NotFound(f"sweep {sweep_id} not found (sweeps started by the timer are audited, not reported)")
    done = [d for d, _ in rows if "org" in d]
    findings: list[dict[str, Any]] = [f for d in done for f in d.get("findings", [])]
    skipped = [f"{d['org']}/{d['provider']}: {d['skipped']}" for d in done if d.get("skipped")]
    return {"sweep_id": sweep_id, "dry_run": head["dry_run"], "accounts": head["accounts"], "done": len(done),
            "finished": len(done) >= head["accounts"], "findings": findings,
            "listed": sum(d.get("listed", 0) for d in done), "runs_read": sum(d.get("runs_read", 0) for d in done),
            **({"skipped": skipped} if skipped else {})}


def tick(ctx: Context) -> dict[str, Any]:
    """The timer: the fan-out, and the poison queues' depths for the operators' alert."""
    out = fan_out(ctx)
    poison_depths(ctx)
    return out


def poison_depths(ctx: Context) -> None:
    queues = ctx.queues
    for step in Step:
        try:
            metrics.gauge(metrics.POISON_DEPTH, queues.length(step.poison), queue=step.value)
        except Exception:  # a poison queue never created yet: nothing there
            metrics.gauge(metrics.POISON_DEPTH, 0, queue=step.value)
