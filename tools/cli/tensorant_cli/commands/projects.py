"""`tensorant projects ...`: the organization's projects."""

from __future__ import annotations

import argparse
from typing import Any

from tensorant_cli.client import Client
from tensorant_cli.commands.common import group, leaf
from tensorant_cli.output import emit, items, table


def add_parser(sub: Any) -> None:
    pr = group(sub, "projects", "projects")
    leaf(pr, "create", "create a project", "PROJECT=$(tensorant projects create demo -q)").add_argument("name")
    leaf(pr, "list", "list projects", "tensorant projects list")
    for s in pr.choices.values():
        s.set_defaults(fn=cmd_projects)


def cmd_projects(args: argparse.Namespace, client: Client) -> int:
    if args.action == "create":
        p = client.post("/api/projects", {"name": args.name})
        emit(args, p, f"created project {p.get('id')} ({p.get('name')})" if isinstance(p, dict) else p)
    else:
        data = client.get("/api/projects")
        emit(args, data, lambda: table(items(data, "projects"), ["id", "name", "created_at"]))
    return 0
