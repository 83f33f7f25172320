"""What the command groups share: the usage error, how a command's parser is made, the run a
command is about."""

from __future__ import annotations

import argparse
from typing import Any

from tensorant_cli.client import Client
from tensorant_cli.output import items

FORMATTER = argparse.RawDescriptionHelpFormatter


class UsageError(Exception):
    """A command line that cannot be carried out as given (exit code 2)."""


def leaf(sub: Any, name: str, help_: str, example: str, *, objects: bool = True,
         run_id: bool = False) -> argparse.ArgumentParser:
    """A command with its help, an example, and the common output options."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_,
                                                epilog="example:\n  " + example.replace("\n", "\n  "),
                                                formatter_class=FORMATTER)
    if objects:
        p.add_argument("--json", action="store_true", help="print the API's JSON answer")
        p.add_argument("-q", "--quiet", action="store_true", help="print only the id(s)")
    if run_id:
        p.add_argument("id", nargs="?", help="run id (or --last)")
        p.add_argument("--last", action="store_true", help="the newest run")
    return p


def group(sub: Any, name: str, help_: str) -> Any:
    """A command with actions (`tensorant runs ACTION`): the subparsers its actions are added to."""
    return sub.add_parser(name, help=help_, description=help_).add_subparsers(dest="action", required=True,
                                                                              metavar="ACTION")


def run_id_of(args: argparse.Namespace, client: Client) -> str:
    """The run a command is about: its id, or the newest run with --last."""
    if getattr(args, "last", False):
        if getattr(args, "id", None):
            raise UsageError("give a run id or --last, not both")
        runs = items(client.get("/api/runs"), "runs")
        if not runs:
            raise UsageError("--last: the organization has no runs yet")
        newest = max(runs, key=lambda r: str(r.get("created_at") or ""))
        return str(newest["id"])
    if not getattr(args, "id", None):
        raise UsageError("give a run id, or --last for the newest run")
    return str(args.id)
