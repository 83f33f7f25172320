"""`tensorant admin ...`: platform admin: queue lengths, poison messages, the sweeper."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tensorant_cli.client import Client
from tensorant_cli.commands.common import group, leaf
from tensorant_cli.output import emit, items, out, say, table

# The Functions host reserves routes that start with "admin", so the admin API lives here.
ADMIN = "/api/platform"


def add_parser(sub: Any) -> None:
    ad = group(sub, "admin", "platform admin: queues, poison messages, sweeper")
    leaf(ad, "queues", "queue lengths and their poison queues", "tensorant admin queues")
    po = ad.add_parser("poison", help="poison messages", description="poison messages").add_subparsers(
        dest="poison_action", required=True, metavar="ACTION")
    leaf(po, "list", "a queue's poison messages", "tensorant admin poison list launch").add_argument("queue")
    rp = leaf(po, "replay", "put poison messages back on their queue", "tensorant admin poison replay launch --id m1")
    rp.add_argument("queue")
    rp.add_argument("--id", help="one message (default: all)")
    dc = leaf(po, "discard", "delete one poison message", "tensorant admin poison discard launch --id m1",
              objects=False)
    dc.add_argument("queue")
    dc.add_argument("--id", required=True)
    for s in po.choices.values():
        s.set_defaults(fn=cmd_admin, action="poison")
    sw = leaf(ad, "sweep", "find leaked resources in every compute connection (dry run unless --apply); "
              "waits for every account's sweep and prints the findings", "tensorant admin sweep --dry-run")
    mode = sw.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", default=True)
    mode.add_argument("--apply", action="store_true")
    sw.add_argument("--no-wait", action="store_true", help="print the sweep's id and status URL and return at once")
    sw.add_argument("--timeout", type=float, default=600, help="seconds to wait for every account (default 600)")
    for name, s in ad.choices.items():
        if name != "poison":
            s.set_defaults(fn=cmd_admin)


def cmd_admin(args: argparse.Namespace, client: Client) -> int:
    if args.action == "queues":
        data = client.get(f"{ADMIN}/queues")
        emit(args, data, lambda: table(items(data, "queues"), ["name", "length", "poison_length"]),
             ids=[str(q.get("name")) for q in items(data, "queues")])
    elif args.action == "poison":
        q = args.queue
        if args.poison_action == "list":
            data = client.get(f"{ADMIN}/queues/{q}/poison")
            emit(args, data, lambda: table(items(data, "messages"), [
                "id", "run_id", "org", "dequeue_count", "inserted_on", "last_error"], empty="(no poison messages)"))
        elif args.poison_action == "replay":
            result = client.post(f"{ADMIN}/queues/{q}/poison/replay", {"message_id": args.id})
            replayed = result.get("replayed") if isinstance(result, dict) else None
            if isinstance(replayed, list):
                say(f"replayed {len(replayed)} message(s) onto {q}" + (f": {', '.join(replayed)}" if replayed else ""))
            else:
                print(json.dumps(result, default=str))
        else:
            client.delete(f"{ADMIN}/queues/{q}/poison/{args.id}")
            say(f"discarded {args.id} from {q}-poison")
    elif args.action == "sweep":
        return _sweep(args, client)
    return 0


def _sweep(args: argparse.Namespace, client: Client) -> int:
    """Start a sweep (one message per account, answered at once), then follow its report until every
    account is done, showing progress; exit 1 if it did not finish within --timeout."""
    started = client.post(f"{ADMIN}/sweep", {"dry_run": not args.apply})
    if args.no_wait or not isinstance(started, dict) or not started.get("status_url"):
        out(started)
        return 0
    say(f"sweep {started['sweep_id']}: {started.get('accounts', 0)} account(s) queued", file=sys.stderr)
    deadline, shown = time.monotonic() + args.timeout, -1
    while True:
        report = client.get(str(started["status_url"]))
        done = int(report.get("done", 0)) if isinstance(report, dict) else 0
        if done != shown:
            say(f"  {done}/{report.get('accounts', '?')} account(s) swept", file=sys.stderr)
            shown = done
        if not isinstance(report, dict) or report.get("finished"):
            out(report)
            return 0
        if time.monotonic() > deadline:
            say(f"error: the sweep did not finish within {args.timeout:.0f} s; follow it with GET "
                f"{started['status_url']}", file=sys.stderr)
            out(report)
            return 1
        time.sleep(1)
