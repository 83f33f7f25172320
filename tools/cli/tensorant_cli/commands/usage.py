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
        budget = data.get("budget") or {}
        limited = [b for b in budget.get("budgets") or [] if b.get("budget_usd") is not None]
        if limited:
            say(f"\nbudgets for {budget.get('month')} (committed = billed + the most active runs can still cost)"
                + (": active runs are retained at 100 %" if budget.get("stop_at_budget") else ""))
            table([{**b, "budget": money(b.get("budget_usd"), "USD"), "billed": money(b.get("billed_usd"), "USD"),
                    "committed": money(b.get("committed_usd"), "USD"), "left": money(b.get("left_usd"), "USD"),
                    "forecast": money(b.get("forecast_usd"), "USD"),
                    "crossed": ",".join(f"{p}%" for p in b.get("crossed_pct") or []) or "-"} for b in limited],
                  ["name", "budget", "billed", "committed", "left", "forecast", "crossed"])

    emit(args, data, text, ids=[])
    return 0
