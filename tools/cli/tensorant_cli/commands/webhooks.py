"""`tensorant webhooks ...`: the organization's signed webhook endpoints (owners change them)."""

from __future__ import annotations

import argparse
from typing import Any

from tensorant_cli.client import Client
from tensorant_cli.commands.common import group, leaf
from tensorant_cli.output import emit, items, say, table


def add_parser(sub: Any) -> None:
    wh = group(sub, "webhooks", "signed webhooks (Standard Webhooks) for what happens to runs and budgets")
    add = leaf(wh, "add", "register an endpoint; its signing secret is printed once",
               "tensorant webhooks add https://hooks.example.com/tensorant --types run.succeeded,run.failed")
    add.add_argument("endpoint_url", metavar="URL", help="https:// URL on a public address")
    add.add_argument("--types", default="", help="comma-separated event types (default: all)")
    add.add_argument("--description", default="")
    add.add_argument("--disabled", action="store_true", help="register it disabled")
    leaf(wh, "list", "list endpoints (secrets are never shown again)", "tensorant webhooks list")
    for name, help_, example in (
            ("rotate", "new signing secret, printed once; the old one signs 24 h more",
             "tensorant webhooks rotate wh-0123456789ab"),
            ("test", "send a webhook.test event to the endpoint", "tensorant webhooks test wh-0123456789ab"),
            ("deliveries", "the endpoint's last 100 delivery attempts", "tensorant webhooks deliveries wh-0123456789ab"),
            ("delete", "delete an endpoint", "tensorant webhooks delete wh-0123456789ab"),
            ("enable", "enable an endpoint (after it was disabled for failing)", "tensorant webhooks enable wh-0123456789ab"),
            ("disable", "stop sending to an endpoint", "tensorant webhooks disable wh-0123456789ab")):
        leaf(wh, name, help_, example).add_argument("id", help="webhook id (wh-...)")
    for s in wh.choices.values():
        s.set_defaults(fn=cmd_webhooks)


def _path(args: argparse.Namespace, tail: str = "") -> str:
    return f"/api/org/webhooks/{args.id}{tail}"


def _secret_text(w: dict[str, Any]) -> None:
    say(f"webhook {w.get('id')} -> {w.get('url')}")
    say(f"signing secret (shown once; store it with your receiver): {w.get('secret')}")
    if w.get("previous_secret_valid_until"):
        say(f"the previous secret also signs until {w['previous_secret_valid_until']}")


def cmd_webhooks(args: argparse.Namespace, client: Client) -> int:
    a = args.action
    if a == "add":
        body: dict[str, Any] = {"url": args.endpoint_url, "enabled": not args.disabled, "description": args.description}
        if args.types:
            body["types"] = [t.strip() for t in args.types.split(",") if t.strip()]
        w = client.post("/api/org/webhooks", body)
        emit(args, w, lambda: _secret_text(w))
    elif a == "list":
        data = client.get("/api/org/webhooks")
        rows = [{**w, "types": ",".join(w.get("types") or []), "enabled": "yes" if w.get("enabled") else
                 ("no: " + w["notice"] if w.get("notice") else "no")} for w in items(data, "items")]
        emit(args, data, lambda: table(rows, ["id", "url", "enabled", "types", "last_success_at"]))
    elif a == "rotate":
        w = client.post(_path(args, "/rotate"))
        emit(args, w, lambda: _secret_text(w))
    elif a == "test":
        r = client.post(_path(args, "/test"))
        emit(args, r, f"queued webhook.test {r.get('webhook_id')}; see `tensorant webhooks deliveries {args.id}`",
             ids=[])
    elif a == "deliveries":
        data = client.get(_path(args, "/deliveries"))
        rows = [{**d, "status": d.get("status_code") or d.get("error")} for d in items(data, "items")]
        emit(args, data, lambda: table(rows, ["at", "webhook_id", "type", "attempt", "outcome", "status",
                                              "duration_ms"], empty="(no delivery attempts yet)"), ids=[])
    elif a == "delete":
        client.delete(_path(args))
        emit(args, {"id": args.id, "deleted": True}, f"deleted webhook {args.id}")
    else:
        w = client.request("PATCH", _path(args), body={"enabled": a == "enable"})
        emit(args, w, f"webhook {args.id} {'enabled' if w.get('enabled') else 'disabled'}")
    return 0
