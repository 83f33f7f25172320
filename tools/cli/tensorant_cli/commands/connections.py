"""`tensorant connections ...`: the organization's compute and storage connections."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tensorant_cli.client import ApiError, Client
from tensorant_cli.commands.common import UsageError, group, leaf
from tensorant_cli.output import cell, emit, items, out, say
from tensorant_cli.schema import SetError, apply_set, compute_schema, provider_names, storage_schema

# Not a list of names: which providers exist is the control plane's to say (its registry, and
# whether the deployment is production), so the help points at the command that asks it.
PROVIDER_HELP = "one of `tensorant connections providers`"
CONNECTION_HELP = (PROVIDER_HELP + " (its default connection), or PROVIDER/NAME: another account or region of "
                   "it saved under a name, e.g. aws/us-west-2")
NAME_HELP = "save it as the named connection {provider}/NAME beside the default (e.g. --name us-west-2)"


def connection_path(connection: str, name: str | None = None) -> str:
    """The API path of a compute connection: `aws` -> .../compute/aws, `aws/us-west-2` (or `aws` with
    name us-west-2) -> .../compute/aws/named/us-west-2."""
    provider, _, sub = connection.partition("/")
    if name:
        if sub and sub != name:
            raise UsageError(f"{connection} already names a connection; leave out --name {name}")
        sub = name
    return f"/api/connections/compute/{provider}" + (f"/named/{sub}" if sub else "")


def add_parser(sub: Any) -> None:
    c = group(sub, "connections", "compute and storage connections")
    for name, help_, example in (
            ("save-compute", "save a compute connection (values typed by the API schema)",
             "tensorant connections save-compute local --set price_per_hour=0 --wait\n"
             "tensorant connections save-compute aws --from-file aws.json --set workspace_disk_gb=200\n"
             "tensorant connections save-compute aws --name us-west-2 --from-file aws-west.json"),
            ("save-storage", "save the organization's storage",
             "tensorant connections save-storage --set kind=local")):
        s = leaf(c, name, help_, example)
        if name == "save-compute":
            s.add_argument("provider", help=CONNECTION_HELP)
            s.add_argument("--name", help=NAME_HELP)
        s.add_argument("--from-file", "--file", dest="from_file", metavar="JSON_FILE",
                       help="the whole connection body as a JSON file")
        s.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="set a field, typed by the schema (repeatable; a.b=c nests)")
        if name == "save-compute":
            s.add_argument("--wait", action="store_true",
                           help="wait for the checks and the catalog; exit 1 if the connection failed")
    leaf(c, "show", "all of the organization's connections and their checks", "tensorant connections show")
    ck = leaf(c, "check", "check a compute connection again", "tensorant connections check aws --wait")
    ck.add_argument("provider", help=CONNECTION_HELP)
    ck.add_argument("--wait", action="store_true", help="wait for the verdict; exit 1 if the connection failed")
    leaf(c, "delete", "delete a compute connection", "tensorant connections delete aws",
         objects=False).add_argument("provider", help=CONNECTION_HELP)
    leaf(c, "providers", "the compute providers this control plane offers (from its API document)",
         "tensorant connections providers")
    for s in c.choices.values():
        s.set_defaults(fn=cmd_connections)


def cmd_connections(args: argparse.Namespace, client: Client) -> int:
    if args.action == "save-compute":
        conn = client.put(connection_path(args.provider, args.name),
                          _body_from(args, client, args.provider.partition("/")[0]))
        if args.wait:
            return _wait_connected(args, client, conn)
        emit(args, conn, lambda: _show_connection(conn), ids=[])
    elif args.action == "save-storage":
        conn = client.put("/api/connections/storage", _body_from(args, client, "storage"))
        emit(args, conn, lambda: _show_connection(conn), ids=[])
    elif args.action == "show":
        data = client.get("/api/connections")
        conns = items(data, "connections")

        def text() -> None:
            if not conns and isinstance(data, dict) and data:
                out(data)
            for c in conns:
                _show_connection(c)
                say()

        emit(args, data, text, ids=[str(c.get("slot")) for c in conns])
    elif args.action == "check":
        conn = client.post(connection_path(args.provider) + "/check")
        if args.wait:
            return _wait_connected(args, client, conn)
        emit(args, conn, lambda: _show_connection(conn), ids=[])
    elif args.action == "delete":
        client.delete(connection_path(args.provider))
        say(f"deleted the {args.provider} connection")
    elif args.action == "providers":
        return _providers(args, client)
    return 0


def _providers(args: argparse.Namespace, client: Client) -> int:
    doc = client.get("/api/openapi.json")
    names = provider_names(doc) if isinstance(doc, dict) else []
    if not names:
        say(f"error: the API document of {client.url} lists no compute providers", file=sys.stderr)
        return 1

    def text() -> None:
        for name in names:
            say(name)

    emit(args, names, text, ids=names)
    return 0


def _body_from(args: argparse.Namespace, client: Client, kind: str) -> dict[str, Any]:
    """A JSON body from --from-file, then --set key=value pairs typed by the API's schema."""
    body: dict[str, Any] = {}
    path = getattr(args, "from_file", None)
    if path:
        try:
            body = json.loads(Path(path).read_text())
        except ValueError as exc:
            raise UsageError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise UsageError(f"{path} must hold a JSON object")
    pairs = getattr(args, "set", None) or []
    if not pairs:
        return body
    try:
        doc = client.get("/api/openapi.json")
    except ApiError:
        doc = None  # an older control plane: values are read as JSON where they parse
    doc = doc if isinstance(doc, dict) else None
    schema = None
    if doc is not None:
        if kind == "storage":
            # The kind picks the schema: from the file, or from a --set kind=... pair.
            kinds = [p.partition("=")[2] for p in pairs if p.startswith("kind=")]
            schema = storage_schema(doc, kinds[-1] if kinds else body.get("kind"))
        else:
            schema = compute_schema(doc, kind)
    try:
        return apply_set(body, pairs, doc, schema)
    except SetError as exc:
        raise UsageError(str(exc)) from exc


def _wait_connected(args: argparse.Namespace, client: Client, conn: Any, timeout: float = 120) -> int:
    """Wait until the checks have run (and the catalog is loaded); 0 if connected, 1 if failed."""
    deadline = time.monotonic() + timeout
    while isinstance(conn, dict) and conn.get("status") == "checking":
        if time.monotonic() > deadline:
            say(f"error: the checks did not finish within {timeout:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.5)
        conn = client.get(connection_path(args.provider, getattr(args, "name", None)))
    emit(args, conn, lambda: _show_connection(conn), ids=[])
    return 0 if isinstance(conn, dict) and conn.get("status") == "connected" else 1


def _show_connection(c: Any) -> None:
    if not isinstance(c, dict):
        say(c)
        return
    slot = str(c.get("slot") or "connection")
    provider = str(c.get("provider") or "")
    name = slot if provider in slot else f"{slot} {provider}".strip()
    say(f"{name}: {c.get('status', '?')}")
    for key, value in (c.get("config") or {}).items():
        say(f"  {key}: {cell(value)}")
    for check in c.get("checks") or []:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}.get(str(check.get("status")), str(check.get("status")))
        say(f"  [{mark}] {check.get('name')}: {check.get('message', '')}")
    for w in c.get("warnings") or []:
        say(f"  warning: {w}")
