"""`tensorant datasets ...`: dataset versions (JSONL), uploaded to a project."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tensorant_cli.client import Client
from tensorant_cli.commands.common import group, leaf
from tensorant_cli.output import emit, items, table


def add_parser(sub: Any) -> None:
    ds = group(sub, "datasets", "dataset versions (JSONL)")
    up = leaf(ds, "upload", "upload a JSONL file as a new dataset version",
              "DATASET=$(tensorant datasets upload \"$PROJECT\" train.jsonl -q)")
    up.add_argument("project_id")
    up.add_argument("file")
    dl = leaf(ds, "list", "list dataset versions (of one project, or of all)", "tensorant datasets list")
    dl.add_argument("project_id", nargs="?")
    for s in ds.choices.values():
        s.set_defaults(fn=cmd_datasets)


def every_page(client: Client, path: str) -> list[dict[str, Any]]:
    """A paginated list whole, following its `next` cursor (the API's pages hold at most 200)."""
    data = client.get(path)
    rows = items(data)
    while isinstance(data, dict) and data.get("next"):
        data = client.get(path, cursor=str(data["next"]))
        rows += items(data)
    return rows


def cmd_datasets(args: argparse.Namespace, client: Client) -> int:
    if args.action == "list":
        projects = [args.project_id] if args.project_id else [
            str(p["id"]) for p in every_page(client, "/api/projects")]
        rows = [dv for pid in projects for dv in every_page(client, f"/api/projects/{pid}/datasets")]
        rows.sort(key=lambda d: str(d.get("created_at") or ""), reverse=True)
        emit(args, {"items": rows}, lambda: table(rows, ["id", "project_id", "rows", "size_bytes", "sha256",
             "created_at"], empty="(no datasets)"))
        return 0
    data = Path(args.file).read_bytes()
    dv = client.request("POST", f"/api/projects/{args.project_id}/datasets", data=data,
                        content_type="application/x-ndjson")
    emit(args, dv, f"dataset version {dv.get('id')}: {dv.get('rows')} rows, sha256 {dv.get('sha256')}"
         if isinstance(dv, dict) else dv)
    return 0
