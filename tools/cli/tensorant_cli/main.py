"""`tensorant`: the command line for the Tensorant control plane API.

Environment: TENSORANT_URL (default http://localhost:7071) and TENSORANT_TOKEN (a bearer
token; `tensorant dev-token` mints one for a local control plane). Exit codes: 0 ok,
1 the API refused or failed (its problem+json is printed), 2 usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from tensorant_cli.client import ApiError, Client

# Where `runs watch` stops: terminal states, and `retained` (the run waits for a person).
STOP_STATES = {"succeeded", "failed", "cancelled", "retained"}


# ---------------------------------------------------------------- output helpers


def _out(args: argparse.Namespace, value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _items(value: Any, *keys: str) -> list[dict[str, Any]]:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        for key in (*keys, "items"):
            if isinstance(value.get(key), list):
                return list(value[key])
    return []


def _table(rows: list[dict[str, Any]], columns: list[str], empty: str = "(none)") -> None:
    if not rows:
        print(empty)
        return
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict | list):
        return json.dumps(v, default=str)
    return str(v)


def _body_from(args: argparse.Namespace) -> dict[str, Any]:
    """A JSON body from --file, then --set key=value pairs (values parsed as JSON when they parse)."""
    body: dict[str, Any] = {}
    if getattr(args, "file", None):
        body = json.loads(Path(args.file).read_text())
        if not isinstance(body, dict):
            raise SystemExit(f"error: {args.file} must hold a JSON object")
    for pair in getattr(args, "set", None) or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --set needs key=value, got {pair!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        target = body
        *parents, leaf = key.split(".")
        for p in parents:  # dotted keys build nested objects: --set credentials.api_key=...
            target = target.setdefault(p, {})
        target[leaf] = value
    return body


def progress_bar(progress: float, width: int = 30) -> str:
    p = min(max(progress or 0.0, 0.0), 1.0)
    filled = round(p * width)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {p * 100:5.1f}%"


def status_line(run: dict[str, Any]) -> str:
    parts = [f"{run.get('id', '?')}", f"state={run.get('state', '?')}"]
    if run.get("phase"):
        parts.append(f"phase={run['phase']}")
    parts.append(progress_bar(float(run.get("progress") or 0.0)))
    if run.get("reason"):
        parts.append(f"reason: {run['reason']}")
    return "  ".join(parts)


# ---------------------------------------------------------------- commands


def cmd_dev_token(args: argparse.Namespace, client: Client) -> int:
    # Minted by the control plane's own code with its settings, so the token is exactly what
    # the local host accepts; those modules exist only where the app and dev host are installed.
    try:
        from shared.models import Role
        from shared.security import mint_user_token
        from shared.settings import reset_settings
        from tensorant_devhost.config import load_local_settings
    except ImportError as exc:
        print(f"error: dev-token needs the control plane and its dev host installed beside the CLI ({exc}); "
              "run it in the repository's environment (`make install`)", file=sys.stderr)
        return 2

    # The same JWT secret as the local host, which reads local.settings.json too.
    load_local_settings(Path.cwd() / "local.settings.json")
    reset_settings()
    from shared.settings import get_settings

    try:
        settings = get_settings()
    except ValueError as exc:  # production settings that fail their checks: production either way
        print(f"error: dev-token does not run here: {exc}", file=sys.stderr)
        return 2
    if settings.is_production:
        # Minting with the production secret would hand out a valid admin token with no login.
        print("error: dev-token refuses to mint tokens with production settings (TENSORANT_ENV=production); "
              "production users get their tokens from the identity provider", file=sys.stderr)
        return 2
    try:
        token = mint_user_token(args.sub, args.org, Role(args.role), ttl_s=args.ttl)
    except ValueError as exc:  # --ttl over the maximum lifetime, or an org/sub that is no id
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(token)
    return 0


def cmd_connections(args: argparse.Namespace, client: Client) -> int:
    if args.action == "save-compute":
        _show_connection(client.put(f"/api/connections/compute/{args.provider}", _body_from(args)))
    elif args.action == "save-storage":
        _show_connection(client.put("/api/connections/storage", _body_from(args)))
    elif args.action == "show":
        data = client.get("/api/connections")
        conns = _items(data, "connections")
        if not conns and isinstance(data, dict) and data:
            _out(args, data)
        for c in conns:
            _show_connection(c)
            print()
    elif args.action == "check":
        _show_connection(client.post(f"/api/connections/compute/{args.provider}/check"))
    elif args.action == "delete":
        client.delete(f"/api/connections/compute/{args.provider}")
        print(f"deleted the {args.provider} connection")
    return 0


def _show_connection(c: Any) -> None:
    if not isinstance(c, dict):
        print(c)
        return
    slot = str(c.get("slot") or "connection")
    provider = str(c.get("provider") or "")
    name = slot if provider in slot else f"{slot} {provider}".strip()
    print(f"{name}: {c.get('status', '?')}")
    for key, value in (c.get("config") or {}).items():
        print(f"  {key}: {_cell(value)}")
    for check in c.get("checks") or []:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}.get(str(check.get("status")), str(check.get("status")))
        print(f"  [{mark}] {check.get('name')}: {check.get('message', '')}")
    for w in c.get("warnings") or []:
        print(f"  warning: {w}")


def cmd_projects(args: argparse.Namespace, client: Client) -> int:
    if args.action == "create":
        p = client.post("/api/projects", {"name": args.name})
        print(f"created project {p.get('id')} ({p.get('name')})" if isinstance(p, dict) else p)
    else:
        _table(_items(client.get("/api/projects"), "projects"), ["id", "name", "created_at"])
    return 0


def cmd_datasets(args: argparse.Namespace, client: Client) -> int:
    data = Path(args.file).read_bytes()
    dv = client.request("POST", f"/api/projects/{args.project_id}/datasets", data=data,
                        content_type="application/x-ndjson")
    if isinstance(dv, dict):
        print(f"dataset version {dv.get('id')}: {dv.get('rows')} rows, sha256 {dv.get('sha256')}")
    else:
        print(dv)
    return 0


def cmd_catalog(args: argparse.Namespace, client: Client) -> int:
    data = client.get("/api/catalog/gpus", provider=args.provider or "")
    offers = _items(data, "offers")
    _table(offers, ["provider", "offer_id", "gpu", "gpu_memory_gb", "machine_type", "region", "zone",
                    "compute_per_hour", "disk_per_hour", "total_per_hour"], empty="(no offers)")
    if isinstance(data, dict):
        for cat in data.get("catalogs") or []:
            status = "refreshing" if cat.get("refreshing") else f"fetched {cat.get('fetched_at') or 'never'}"
            print(f"{cat.get('provider')}: {status}" + (f"; last error: {cat['last_error']}"
                                                         if cat.get("last_error") else ""))
        if data.get("note"):
            print(f"note: {data['note']}")
    return 0


def cmd_runs(args: argparse.Namespace, client: Client) -> int:
    a = args.action
    if a == "create":
        body: dict[str, Any] = {"project_id": args.project, "dataset_version_id": args.dataset,
                                "provider": args.provider, "offer_id": args.offer, "base_model": args.base_model,
                                "price_limit_per_hour": args.price_limit, "kind": args.kind}
        if args.runtime_limit is not None:
            body["runtime_limit_s"] = args.runtime_limit
        run = client.post("/api/runs", body)
        print(f"created run {run.get('id')} (state {run.get('state')})" if isinstance(run, dict) else run)
    elif a == "list":
        _table(_items(client.get("/api/runs"), "runs"),
               ["id", "kind", "state", "phase", "progress", "provider", "created_at"], empty="(no runs)")
    elif a == "get":
        _out(args, client.get(f"/api/runs/{args.id}"))
    elif a == "launch":
        return _launch(args, client)
    elif a == "watch":
        return watch(client, args.id, interval=args.interval, stream=sys.stdout)
    elif a == "logs":
        return _logs(args, client)
    elif a == "cancel":
        run = client.post(f"/api/runs/{args.id}/cancel", {"discard": not args.keep})
        print(status_line(run) if isinstance(run, dict) else run)
    elif a == "recover":
        if args.upload:
            run = client.request("POST", f"/api/runs/{args.id}/recover", data=Path(args.upload).read_bytes(),
                                 content_type="application/zip")
        else:
            mode = "start_machine" if args.start_machine else "verify_saved"
            run = client.post(f"/api/runs/{args.id}/recover", {"mode": mode})
        print(status_line(run) if isinstance(run, dict) else run)
        if isinstance(run, dict) and run.get("billing_note"):
            print(f"billing: {run['billing_note']}")
    elif a == "release":
        run = client.post(f"/api/runs/{args.id}/release")
        print(status_line(run) if isinstance(run, dict) else run)
    return 0


def _launch(args: argparse.Namespace, client: Client) -> int:
    run = client.get(f"/api/runs/{args.id}")
    offer = run.get("offer") or {}
    estimate = run.get("estimate_per_hour", offer.get("total_per_hour"))
    limit = run.get("price_limit_per_hour")
    print(f"Run {args.id}: {offer.get('gpu', '?')} on {run.get('provider', '?')} "
          f"({offer.get('machine_type', '?')}, {offer.get('region', '?')})")
    print(f"Estimate: {_cell(estimate)} {offer.get('currency', 'USD')}/hour (your limit: {_cell(limit)}/hour); "
          f"runtime limit {_cell(run.get('runtime_limit_s'))} s")
    if run.get("billing_note"):
        print(f"Note: {run['billing_note']}")
    if not args.yes:
        if not sys.stdin.isatty():
            print("error: not confirmed; pass --yes to launch without a prompt", file=sys.stderr)
            return 1
        if input("Launch and start billing in your account? [y/N] ").strip().lower() not in ("y", "yes"):
            print("not launched")
            return 1
    run = client.post(f"/api/runs/{args.id}/launch", {"confirm": True})
    print(f"launched: {status_line(run)}" if isinstance(run, dict) else run)
    return 0


def watch(client: Client, run_id: str, *, interval: float = 2.0, stream: TextIO | None = None,
          max_polls: int | None = None) -> int:
    """Show state, phase and progress until the run stops; 0 if it succeeded, 1 otherwise."""
    out = stream or sys.stdout
    tty = out.isatty()
    last = ""
    polls = 0
    while True:
        run = client.get(f"/api/runs/{run_id}")
        line = status_line(run)
        if tty:
            out.write("\r\033[K" + line)
        elif line != last:
            out.write(line + "\n")
        out.flush()
        last = line
        state = str(run.get("state", ""))
        if state in STOP_STATES:
            if tty:
                out.write("\n")
            if run.get("billing_note"):
                out.write(f"billing: {run['billing_note']}\n")
            outcome = run.get("outcome")
            out.write(f"run {run_id} {state}" + (f" (outcome: {outcome})" if outcome and outcome != state else "") + "\n")
            return 0 if state == "succeeded" else 1
        polls += 1
        if max_polls is not None and polls >= max_polls:
            return 1
        time.sleep(interval)


def _logs(args: argparse.Namespace, client: Client) -> int:
    printed = 0
    while True:
        lines = _items(client.get(f"/api/runs/{args.id}/logs"), "lines") or []
        for line in lines[printed:]:
            print(line if isinstance(line, str) else json.dumps(line, default=str))
        printed = max(printed, len(lines))
        if not args.follow:
            return 0
        run = client.get(f"/api/runs/{args.id}")
        if str(run.get("state")) in STOP_STATES:
            tail = _items(client.get(f"/api/runs/{args.id}/logs"), "lines") or []
            for line in tail[printed:]:
                print(line if isinstance(line, str) else json.dumps(line, default=str))
            return 0
        sys.stdout.flush()
        time.sleep(args.interval)


# The Functions host reserves routes that start with "admin", so the admin API lives here.
ADMIN = "/api/platform"


def cmd_admin(args: argparse.Namespace, client: Client) -> int:
    if args.action == "queues":
        _table(_items(client.get(f"{ADMIN}/queues"), "queues"), ["name", "length", "poison_length"])
    elif args.action == "poison":
        q = args.queue
        if args.poison_action == "list":
            _table(_items(client.get(f"{ADMIN}/queues/{q}/poison"), "messages"),
                   ["id", "run_id", "org", "dequeue_count", "inserted_on", "last_error"], empty="(no poison messages)")
        elif args.poison_action == "replay":
            result = client.post(f"{ADMIN}/queues/{q}/poison/replay", {"message_id": args.id})
            replayed = result.get("replayed") if isinstance(result, dict) else None
            if isinstance(replayed, list):
                print(f"replayed {len(replayed)} message(s) onto {q}" + (f": {', '.join(replayed)}" if replayed else ""))
            else:
                print(json.dumps(result, default=str))
        else:
            client.delete(f"{ADMIN}/queues/{q}/poison/{args.id}")
            print(f"discarded {args.id} from {q}-poison")
    elif args.action == "sweep":
        _out(args, client.post(f"{ADMIN}/sweep", {"dry_run": not args.apply}))
    return 0


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorant", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("TENSORANT_URL", "http://localhost:7071"),
                   help="control plane URL (env TENSORANT_URL)")
    p.add_argument("--token", default=os.environ.get("TENSORANT_TOKEN"), help="bearer token (env TENSORANT_TOKEN)")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("dev-token", help="mint a development token with the local JWT secret (prints it only)")
    t.add_argument("--org", default="dev-org")
    t.add_argument("--role", default="owner", choices=["owner", "member", "admin"])
    t.add_argument("--sub", default="dev-user")
    t.add_argument("--ttl", type=int, default=12 * 3600, help="lifetime in seconds")
    t.set_defaults(fn=cmd_dev_token)

    c = sub.add_parser("connections", help="compute and storage connections").add_subparsers(dest="action",
                                                                                            required=True)
    for name, help_ in (("save-compute", "save a compute connection"), ("save-storage", "save the storage")):
        s = c.add_parser(name, help=help_)
        if name == "save-compute":
            s.add_argument("provider", help="a compute provider the control plane registers (aws, azure, runpod, local, ...)")
        s.add_argument("--file", help="JSON body")
        s.add_argument("--set", action="append", metavar="KEY=VALUE", help="set a field (repeatable; a.b=c nests)")
    c.add_parser("show", help="all of the organization's connections and their checks")
    c.add_parser("check", help="check a compute connection again").add_argument("provider")
    c.add_parser("delete", help="delete a compute connection").add_argument("provider")
    for s in c.choices.values():
        s.set_defaults(fn=cmd_connections)

    pr = sub.add_parser("projects", help="projects").add_subparsers(dest="action", required=True)
    pr.add_parser("create").add_argument("name")
    pr.add_parser("list")
    for s in pr.choices.values():
        s.set_defaults(fn=cmd_projects)

    ds = sub.add_parser("datasets", help="datasets").add_subparsers(dest="action", required=True)
    up = ds.add_parser("upload", help="upload a JSONL file as a new dataset version")
    up.add_argument("project_id")
    up.add_argument("file")
    up.set_defaults(fn=cmd_datasets)

    cat = sub.add_parser("catalog", help="GPU offers with prices per hour")
    cat.add_argument("--provider")
    cat.set_defaults(fn=cmd_catalog)

    r = sub.add_parser("runs", help="training runs").add_subparsers(dest="action", required=True)
    cr = r.add_parser("create", help="create a draft run")
    cr.add_argument("--project", required=True)
    cr.add_argument("--dataset", required=True, help="dataset version id")
    cr.add_argument("--provider", required=True)
    cr.add_argument("--offer", required=True, help="offer id from `tensorant catalog`")
    cr.add_argument("--base-model", required=True)
    cr.add_argument("--price-limit", type=float, required=True, help="USD per hour")
    cr.add_argument("--runtime-limit", type=int, help="seconds")
    cr.add_argument("--kind", choices=["trial", "full"], default="trial")
    r.add_parser("list")
    for name in ("get", "release"):
        r.add_parser(name).add_argument("id")
    la = r.add_parser("launch", help="show the estimate and launch (asks unless --yes)")
    la.add_argument("id")
    la.add_argument("--yes", action="store_true")
    w = r.add_parser("watch", help="follow state and progress; exit 0 only if the run succeeds")
    w.add_argument("id")
    w.add_argument("--interval", type=float, default=2.0)
    lg = r.add_parser("logs")
    lg.add_argument("id")
    lg.add_argument("--follow", "-f", action="store_true")
    lg.add_argument("--interval", type=float, default=2.0)
    ca = r.add_parser("cancel", help="cancel; the machine and disk are deleted unless --keep")
    ca.add_argument("id")
    ca.add_argument("--keep", action="store_true", help="keep the disk (retain) instead of discarding")
    rc = r.add_parser("recover", help="recover a retained run")
    rc.add_argument("id")
    how = rc.add_mutually_exclusive_group(required=True)
    how.add_argument("--upload", metavar="ADAPTER_ZIP")
    how.add_argument("--verify-saved", action="store_true", help="verify the adapter already in storage")
    how.add_argument("--start-machine", action="store_true",
                     help="start the retained machine to fetch files from it (GPU billing resumes; training does not)")
    for s in r.choices.values():
        s.set_defaults(fn=cmd_runs)

    ad = sub.add_parser("admin", help="platform admin: queues, poison messages, sweeper").add_subparsers(
        dest="action", required=True)
    ad.add_parser("queues")
    po = ad.add_parser("poison").add_subparsers(dest="poison_action", required=True)
    po.add_parser("list").add_argument("queue")
    rp = po.add_parser("replay")
    rp.add_argument("queue")
    rp.add_argument("--id", help="one message (default: all)")
    dc = po.add_parser("discard")
    dc.add_argument("queue")
    dc.add_argument("--id", required=True)
    sw = ad.add_parser("sweep", help="find leaked resources (dry run unless --apply)")
    mode = sw.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", default=True)
    mode.add_argument("--apply", action="store_true")
    for s in ad.choices.values():
        s.set_defaults(fn=cmd_admin)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    client = Client(args.url, args.token)
    try:
        code: int = args.fn(args, client)
    except ApiError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # a file that cannot be read
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
