"""`tensorant usage`: runs, GPU hours and cost per provider since a date."""

from __future__ import annotations

import argparse
from typing import Any

from tensorant_cli.client import Client
from tensorant_cli.commands.common import leaf
from tensorant_cli.output import emit, say, table
from tensorant_cli.render import gpu_hours, money


def add_parser(sub: Any) -> None:
    us = leaf(sub, "usage", "runs, GPU hours and cost per provider since a date",
              "tensorant usage --since 2026-01-01")
    us.add_argument("--since", help="ISO date (default: 30 days ago)")
    us.set_defaults(fn=cmd_usage)


def cmd_usage(args: argparse.Namespace, client: Client) -> int:
    data = client.get("/api/usage", since=args.since or "")

    def text() -> None:
        say(f"usage since {data.get('since')}")
        rows = list(data.get("providers") or [])
        total = data.get("total") or {}
        if rows:
            rows.append({"provider": "total", **total})
        rows = [{**r, "gpu_hours": gpu_hours(r.get("gpu_hours")), "cost": money(r.get("cost"), r.get("currency") or "USD")}
                for r in rows]
        table(rows, ["provider", "runs", "gpu_hours", "cost"], empty="(no runs launched)")
        if total.get("checkpoint_adapters"):
            say(f"{total['checkpoint_adapters']} of these runs ended with a checkpoint's adapter (accepted at a "
                "recovery), not a completed training")

    emit(args, data, text, ids=[])
    return 0
