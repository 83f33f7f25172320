"""`tensorant catalog`: the GPU offers of the connected providers, with prices per hour."""

from __future__ import annotations

import argparse
from typing import Any

from tensorant_cli.client import Client
from tensorant_cli.commands.common import leaf
from tensorant_cli.output import emit, items, say, table


def add_parser(sub: Any) -> None:
    cat = leaf(sub, "catalog", "GPU offers with prices per hour",
               "tensorant catalog --provider aws | head\nOFFER=$(tensorant catalog --provider local -q | head -n1)")
    cat.add_argument("--provider")
    cat.add_argument("--connection", help="one compute connection's offers: `{provider}` or `{provider}/{name}`")
    cat.set_defaults(fn=cmd_catalog)


def cmd_catalog(args: argparse.Namespace, client: Client) -> int:
    data = client.get("/api/catalog/gpus", provider=args.provider or "", connection=args.connection or "")
    offers = items(data, "offers")

    def text() -> None:
        table(offers, ["provider", "connection", "offer_id", "gpu", "gpu_memory_gb", "machine_type", "region", "zone",
              "compute_per_hour", "disk_per_hour", "total_per_hour"], empty="(no offers)")
        if isinstance(data, dict):
            for cat in data.get("catalogs") or []:
                status = "refreshing" if cat.get("refreshing") else f"fetched {cat.get('fetched_at') or 'never'}"
                say(f"{cat.get('connection') or cat.get('provider')}: {status}" + (f"; last error: {cat['last_error']}"
                                                          if cat.get("last_error") else ""))
            if data.get("note"):
                say(f"note: {data['note']}")

    emit(args, data, text, ids=[str(o.get("offer_id")) for o in offers])
    return 0
