"""`tensorant`: the command line for the Tensorant control plane API.

Environment: TENSORANT_URL (default http://localhost:7071) and TENSORANT_TOKEN (a bearer
token; `tensorant dev-token` mints one for a local control plane). Exit codes: 0 ok,
1 the API refused or failed (its problem+json is printed) or a run ended badly, 2 usage errors.
Objects print as text; `--json` prints them as the API returned them, `-q` prints only ids.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from tensorant_cli.client import ApiError, Client, _error
from tensorant_cli.render import (
    cli_words,
    clock,
    duration,
    forecast_line,
    gpu_hours,
    money,
    percent,
    printable,
    progress_bar,
    sparkline,
    status_block,
    status_line,
)
from tensorant_cli.schema import SetError, apply_set, compute_schema, storage_schema

__all__ = ["main", "progress_bar", "status_line", "watch"]

# Where `runs watch` stops: terminal states, and `retained` (the run waits for a person).
STOP_STATES = {"succeeded", "failed", "cancelled", "retained"}


class UsageError(Exception):
    """A command line that cannot be carried out as given (exit code 2)."""


# ---------------------------------------------------------------- output helpers


def _say(text: Any = "", file: TextIO | None = None) -> None:
    """print for every line of text output: most of it came from a run or a cloud (log lines,
    reasons, events, check messages), and an escape sequence in it would drive the user's terminal
    (retitle it, clear it, overwrite a line with a fake "succeeded"); control characters show as \\xNN."""
    print(printable(text), file=file)


def _out(args: argparse.Namespace, value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))  # JSON escapes control characters itself


def _emit(args: argparse.Namespace, value: Any, text: Any, ids: Any = None) -> None:
    """Print `value` as JSON (--json), its ids (-q), or the human text (a callable or a string)."""
    if getattr(args, "json", False):
        _out(args, value)
    elif getattr(args, "quiet", False):
        for i in (ids if ids is not None else _ids(value)):
            _say(i)
    elif callable(text):
        text()
    else:
        _say(text)


def _ids(value: Any) -> list[str]:
    if isinstance(value, dict) and "id" in value:
        return [str(value["id"])]
    return [str(r.get("id") or r.get("offer_id")) for r in _items(value) if isinstance(r, dict)]


def _items(value: Any, *keys: str) -> list[dict[str, Any]]:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        for key in (*keys, "items"):
            if isinstance(value.get(key), list):
                return list(value[key])
    return []


def _table(rows: list[dict[str, Any]], columns: list[str], empty: str = "(none)",
           headers: dict[str, str] | None = None) -> None:
    if not rows:
        _say(empty)
        return
    names = [(headers or {}).get(c, c) for c in columns]
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(n), *(len(row[i]) for row in cells)) for i, n in enumerate(names)]
    _say("  ".join(n.upper().ljust(w) for n, w in zip(names, widths, strict=True)).rstrip())
    for row in cells:
        _say("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict | list):
        return json.dumps(v, default=str)
    return printable(v)  # before padding: an escaped character is as wide as it prints


def _short(text: Any, width: int = 60) -> str:
    s = str(text or "")
    return s if len(s) <= width else s[: width - 1] + "…"


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


def _run_id(args: argparse.Namespace, client: Client) -> str:
    """The run a command is about: its id, or the newest run with --last."""
    if getattr(args, "last", False):
        if getattr(args, "id", None):
            raise UsageError("give a run id or --last, not both")
        items = _items(client.get("/api/runs"), "runs")
        if not items:
            raise UsageError("--last: the organization has no runs yet")
        newest = max(items, key=lambda r: str(r.get("created_at") or ""))
        return str(newest["id"])
    if not getattr(args, "id", None):
        raise UsageError("give a run id, or --last for the newest run")
    return str(args.id)


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
        _say(f"error: dev-token needs the control plane and its dev host installed beside the CLI ({exc}); "
              "run it in the repository's environment (`make install`)", file=sys.stderr)
        return 2

    # The same JWT secret as the local host, which reads local.settings.json too.
    load_local_settings(Path.cwd() / "local.settings.json")
    reset_settings()
    from shared.settings import get_settings

    try:
        settings = get_settings()
    except ValueError as exc:  # production settings that fail their checks: production either way
        _say(f"error: dev-token does not run here: {exc}", file=sys.stderr)
        return 2
    if settings.is_production:
        # Minting with the production secret would hand out a valid admin token with no login.
        _say("error: dev-token refuses to mint tokens with production settings (TENSORANT_ENV=production); "
              "production users get their tokens from the identity provider", file=sys.stderr)
        return 2
    try:
        token = mint_user_token(args.sub, args.org, Role(args.role), ttl_s=args.ttl)
    except ValueError as exc:  # --ttl over the maximum lifetime, or an org/sub that is no id
        _say(f"error: {exc}", file=sys.stderr)
        return 2
    _say(token)
    return 0


def cmd_connections(args: argparse.Namespace, client: Client) -> int:
    if args.action == "save-compute":
        conn = client.put(f"/api/connections/compute/{args.provider}", _body_from(args, client, args.provider))
        if args.wait:
            return _wait_connected(args, client, conn)
        _emit(args, conn, lambda: _show_connection(conn), ids=[])
    elif args.action == "save-storage":
        conn = client.put("/api/connections/storage", _body_from(args, client, "storage"))
        _emit(args, conn, lambda: _show_connection(conn), ids=[])
    elif args.action == "show":
        data = client.get("/api/connections")
        conns = _items(data, "connections")

        def text() -> None:
            if not conns and isinstance(data, dict) and data:
                _out(args, data)
            for c in conns:
                _show_connection(c)
                _say()

        _emit(args, data, text, ids=[str(c.get("slot")) for c in conns])
    elif args.action == "check":
        conn = client.post(f"/api/connections/compute/{args.provider}/check")
        if args.wait:
            return _wait_connected(args, client, conn)
        _emit(args, conn, lambda: _show_connection(conn), ids=[])
    elif args.action == "delete":
        client.delete(f"/api/connections/compute/{args.provider}")
        _say(f"deleted the {args.provider} connection")
    return 0


def _wait_connected(args: argparse.Namespace, client: Client, conn: Any, timeout: float = 120) -> int:
    """Wait until the checks have run (and the catalog is loaded); 0 if connected, 1 if failed."""
    deadline = time.monotonic() + timeout
    while isinstance(conn, dict) and conn.get("status") == "checking":
        if time.monotonic() > deadline:
            _say(f"error: the checks did not finish within {timeout:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.5)
        conn = client.get(f"/api/connections/compute/{args.provider}")
    _emit(args, conn, lambda: _show_connection(conn), ids=[])
    return 0 if isinstance(conn, dict) and conn.get("status") == "connected" else 1


def _show_connection(c: Any) -> None:
    if not isinstance(c, dict):
        _say(c)
        return
    slot = str(c.get("slot") or "connection")
    provider = str(c.get("provider") or "")
    name = slot if provider in slot else f"{slot} {provider}".strip()
    _say(f"{name}: {c.get('status', '?')}")
    for key, value in (c.get("config") or {}).items():
        _say(f"  {key}: {_cell(value)}")
    for check in c.get("checks") or []:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}.get(str(check.get("status")), str(check.get("status")))
        _say(f"  [{mark}] {check.get('name')}: {check.get('message', '')}")
    for w in c.get("warnings") or []:
        _say(f"  warning: {w}")


def cmd_projects(args: argparse.Namespace, client: Client) -> int:
    if args.action == "create":
        p = client.post("/api/projects", {"name": args.name})
        _emit(args, p, f"created project {p.get('id')} ({p.get('name')})" if isinstance(p, dict) else p)
    else:
        data = client.get("/api/projects")
        _emit(args, data, lambda: _table(_items(data, "projects"), ["id", "name", "created_at"]))
    return 0


def cmd_datasets(args: argparse.Namespace, client: Client) -> int:
    if args.action == "list":
        projects = [args.project_id] if args.project_id else [
            str(p["id"]) for p in _items(client.get("/api/projects"), "projects")]
        rows = [dv for pid in projects for dv in _items(client.get(f"/api/projects/{pid}/datasets"), "datasets")]
        rows.sort(key=lambda d: str(d.get("created_at") or ""), reverse=True)
        _emit(args, {"items": rows}, lambda: _table(rows, ["id", "project_id", "rows", "size_bytes", "sha256",
                                                           "created_at"], empty="(no datasets)"))
        return 0
    data = Path(args.file).read_bytes()
    dv = client.request("POST", f"/api/projects/{args.project_id}/datasets", data=data,
                        content_type="application/x-ndjson")
    _emit(args, dv, f"dataset version {dv.get('id')}: {dv.get('rows')} rows, sha256 {dv.get('sha256')}"
          if isinstance(dv, dict) else dv)
    return 0


def cmd_catalog(args: argparse.Namespace, client: Client) -> int:
    data = client.get("/api/catalog/gpus", provider=args.provider or "")
    offers = _items(data, "offers")

    def text() -> None:
        _table(offers, ["provider", "offer_id", "gpu", "gpu_memory_gb", "machine_type", "region", "zone",
                        "compute_per_hour", "disk_per_hour", "total_per_hour"], empty="(no offers)")
        if isinstance(data, dict):
            for cat in data.get("catalogs") or []:
                status = "refreshing" if cat.get("refreshing") else f"fetched {cat.get('fetched_at') or 'never'}"
                _say(f"{cat.get('provider')}: {status}" + (f"; last error: {cat['last_error']}"
                                                             if cat.get("last_error") else ""))
            if data.get("note"):
                _say(f"note: {data['note']}")

    _emit(args, data, text, ids=[str(o.get("offer_id")) for o in offers])
    return 0


def cmd_usage(args: argparse.Namespace, client: Client) -> int:
    data = client.get("/api/usage", since=args.since or "")

    def text() -> None:
        _say(f"usage since {data.get('since')}")
        rows = list(data.get("providers") or [])
        total = data.get("total") or {}
        if rows:
            rows.append({"provider": "total", **total})
        rows = [{**r, "gpu_hours": gpu_hours(r.get("gpu_hours")), "cost": money(r.get("cost"), r.get("currency") or "USD")}
                for r in rows]
        _table(rows, ["provider", "runs", "gpu_hours", "cost"], empty="(no runs launched)")

    _emit(args, data, text, ids=[])
    return 0


def _run_create_body(args: argparse.Namespace, partial: bool) -> dict[str, Any]:
    fields = {"project_id": getattr(args, "project", None), "dataset_version_id": args.dataset,
              "provider": args.provider, "offer_id": args.offer, "base_model": args.base_model,
              "price_limit_per_hour": args.price_limit, "kind": args.kind, "runtime_limit_s": args.runtime_limit}
    if not partial and fields["kind"] is None:
        fields["kind"] = "trial"
    body = {k: v for k, v in fields.items() if v is not None}
    training = training_from(args)
    if training:
        body["training"] = training
    return body


def _show_run(run: dict[str, Any], client: Client | None = None) -> None:
    offer = run.get("offer") or {}
    currency = str(offer.get("currency") or "USD")
    for line in status_block(run):
        _say(line)
    _say(f"  estimate {money(run.get('estimate_per_hour'), currency)}/h (limit "
          f"{money(run.get('price_limit_per_hour'), currency)}/h); runtime limit "
          f"{duration(run.get('runtime_limit_s'))}; base model {run.get('base_model')}; kind {run.get('kind')}")
    if (forecast := forecast_line(run)) is not None:
        _say(f"  {forecast}")
    if run.get("final_cost") is not None:
        _say(f"  final cost {money(run['final_cost'], currency)}: machine {duration(run.get('billed_machine_s'))}"
              f", disk only {duration(run.get('billed_disk_only_s'))}")
    for key in ("started_at", "machine_up_at", "released_at"):
        if run.get(key):
            _say(f"  {key.replace('_at', '').replace('_', ' ')}: {run[key]}")
    for w in run.get("warnings") or []:
        _say(f"  warning: {cli_words(w, str(run.get('id')))}")
    if run.get("billing_note"):
        _say(f"  billing: {run['billing_note']}")
    if run.get("release_error"):
        _say(f"  release error (attempt {run.get('release_attempts')}): {run['release_error']}")
    for res in run.get("resources") or []:
        _say(f"  resource {res.get('kind')} {res.get('id')}: {res.get('state') or '-'}")
    if run.get("adapter_sha256"):
        _say(f"  adapter sha256 {run['adapter_sha256']}")
    if client is not None and run.get("state") != "draft":
        try:
            points = _items(client.get(f"/api/runs/{run['id']}/metrics"), "points")
        except ApiError:
            points = []
        losses = [float(p["loss"]) for p in points if isinstance(p, dict) and p.get("loss") is not None]
        if losses:
            _say(f"  loss {sparkline(losses)}  {losses[0]:.4g} -> {losses[-1]:.4g} over {len(losses)} steps")
    events = [e for e in run.get("events") or [] if e.get("kind") in ("transition", "warning")]
    if events:
        _say("  history:")
        for e in events:
            _say(f"    {clock(e.get('at'))}  {cli_words(str(e.get('message')), str(run.get('id')))}")


def _run_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in items:
        cost = r.get("final_cost") if r.get("final_cost") is not None else r.get("cost_so_far")
        currency = str((r.get("offer") or {}).get("currency") or "USD")
        rows.append({**r, "progress": percent(r.get("progress")), "cost": money(cost, currency),
                     "elapsed": duration(r.get("elapsed_s")), "billed_gpu": duration(r.get("billed_machine_s")),
                     "reason": _short(r.get("reason"), 50)})
    return rows


def cmd_runs(args: argparse.Namespace, client: Client) -> int:
    a = args.action
    if a == "create":
        run = client.post("/api/runs", _run_create_body(args, partial=False))

        def text() -> None:
            _say(f"created run {run.get('id')} (state {run.get('state')}); estimate "
                  f"{money(run.get('estimate_per_hour'))}/h")
            if (forecast := forecast_line(run)) is not None:
                _say(forecast)
            for w in run.get("warnings") or []:
                _say(f"warning: {cli_words(w, str(run.get('id')))}")

        _emit(args, run, text)
    elif a == "list":
        data = client.get("/api/runs")
        # Elapsed and billed GPU time apart: a retained run's clock goes on, its GPU bill does not.
        _emit(args, data, lambda: _table(_run_rows(_items(data, "runs")), [
            "id", "kind", "state", "progress", "cost", "elapsed", "billed_gpu", "provider", "created_at", "reason"],
            empty="(no runs)", headers={"billed_gpu": "billed gpu"}))
    elif a == "get":
        run = client.get(f"/api/runs/{_run_id(args, client)}")
        _emit(args, run, lambda: _show_run(run, client))
    elif a == "edit":
        body = _run_create_body(args, partial=True)
        if not body:
            raise UsageError("give at least one field to change (e.g. --price-limit 2)")
        run = client.request("PATCH", f"/api/runs/{_run_id(args, client)}", body=body)
        _emit(args, run, lambda: _show_run(run))
    elif a == "delete":
        run_id = _run_id(args, client)
        client.delete(f"/api/runs/{run_id}")
        _emit(args, {"id": run_id, "deleted": True}, f"deleted draft {run_id}")
    elif a == "launch":
        return _launch(args, client)
    elif a == "watch":
        return watch(client, _run_id(args, client), interval=args.interval, stream=sys.stdout,
                     logs=not args.no_logs)
    elif a == "logs":
        return _logs(args, client)
    elif a == "cancel":
        return _cancel(args, client)
    elif a == "stop":
        run = client.post(f"/api/runs/{_run_id(args, client)}/stop")
        _say(status_line(run) if isinstance(run, dict) else run)
        if isinstance(run, dict) and run.get("billing_note"):
            _say(f"billing: {run['billing_note']}")
    elif a == "recover":
        return _recover(args, client)
    elif a == "release":
        run = client.post(f"/api/runs/{_run_id(args, client)}/release")
        _emit(args, run, status_line(run) if isinstance(run, dict) else run)
    return 0


# ---------------------------------------------------------------- training, base models, adapter (issue 10)


def training_from(args: argparse.Namespace) -> dict[str, Any]:
    """`--training-json '{...}'` and `--set-training key=value` (value read as JSON when it parses:
    8 -> 8, true -> true, null -> null; otherwise as text: all-linear)."""
    training: dict[str, Any] = {}
    if getattr(args, "training_json", None):
        loaded = json.loads(args.training_json)
        if not isinstance(loaded, dict):
            raise SystemExit("--training-json must be a JSON object, e.g. '{\"lora_r\": 8}'")
        training.update(loaded)
    for item in getattr(args, "set_training", None) or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set-training takes key=value, not {item!r}")
        try:
            training[key.strip()] = json.loads(raw)
        except ValueError:
            training[key.strip()] = raw
    return training


def cmd_base_models(args: argparse.Namespace, client: Client) -> int:
    data = client.get("/api/base-models")
    models = _items(data, "models")
    if getattr(args, "json", False) or getattr(args, "quiet", False):
        _emit(args, data, "", ids=[str(m.get("id")) for m in models])  # -q: the names, for --base-model
        return 0
    rows = [{**m, "params_m": round(m.get("params", 0) / 1e6), "gpu_gb_bf16": (m.get("memory_gb") or {}).get("bf16"),
             "gpu_gb_4bit": (m.get("memory_gb") or {}).get("four_bit")} for m in models]
    _table(rows, ["id", "architecture", "params_m", "layers", "hidden", "gpu_gb_bf16", "gpu_gb_4bit", "local_cpu"],
           empty="(no base models)")
    if isinstance(data, dict) and data.get("note"):
        _say(f"note: {data['note']}")
    return 0


def cmd_runs_download(args: argparse.Namespace, client: Client) -> int:
    """Save the run's verified adapter: streamed (local storage) or fetched from its short-lived URL."""
    import hashlib

    import requests

    args.id = _run_id(args, client)

    headers = {"Accept": "application/zip, application/json, application/problem+json"}
    if client.token:
        headers["Authorization"] = f"Bearer {client.token}"
    try:
        resp = requests.get(f"{client.url}/api/runs/{args.id}/adapter", headers=headers, timeout=client.timeout)
    except requests.ConnectionError:
        raise ApiError(0, f"cannot reach {client.url}", "is the control plane running? (`make run`)") from None
    if resp.status_code >= 400:
        raise _error(resp)
    if resp.headers.get("Content-Type", "").startswith("application/zip"):
        data, expected = resp.content, resp.headers.get("X-Adapter-Sha256", "")
    else:
        link = resp.json()
        got = requests.get(link["url"], timeout=max(client.timeout, 300))  # presigned: no Authorization header
        if got.status_code >= 400:
            raise ApiError(got.status_code, "the download link was refused",
                           "it is short-lived: run `tensorant runs download` again")
        data, expected = got.content, str(link.get("sha256") or "")
    sha = hashlib.sha256(data).hexdigest()
    if expected and sha != expected:
        raise ApiError(0, "the download does not match the verified adapter",
                       f"sha256 {sha}, expected {expected}; nothing was saved")
    out = Path(args.output or f"{args.id}-adapter.zip")
    out.write_bytes(data)
    _say(f"saved {out} ({len(data)} bytes, sha256 {sha})")
    return 0


def _cancel(args: argparse.Namespace, client: Client) -> int:
    """--keep keeps the disk; --discard deletes machine, disk and any output on them (asked
    first on a terminal); neither: the API decides, and refuses for a run that may hold output."""
    args.id = _run_id(args, client)
    body: dict[str, Any] = {}
    if args.keep:
        body["discard"] = False
    elif args.discard:
        if not args.yes:
            if not sys.stdin.isatty():
                _say("error: not confirmed; --discard deletes the machine, its disk and any adapter on it: "
                      "pass --yes as well to discard without a prompt", file=sys.stderr)
                return 1
            answer = input(f"Discard run {args.id}: delete its machine and disk, with any adapter on them? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                _say("not cancelled")
                return 1
        body["discard"] = True
    run = client.post(f"/api/runs/{args.id}/cancel", body)
    _say(status_line(run) if isinstance(run, dict) else run)
    return 0


def _launch(args: argparse.Namespace, client: Client) -> int:
    run_id = args.id = _run_id(args, client)  # an error's hint names it (`tensorant runs edit <id> ...`)
    run = client.get(f"/api/runs/{run_id}")
    offer = run.get("offer") or {}
    estimate = run.get("estimate_per_hour", offer.get("total_per_hour"))
    limit = run.get("price_limit_per_hour")
    talk = sys.stderr if (args.json or args.quiet) else sys.stdout
    if run.get("state") != "draft":
        # Said before any prompt: nothing would be launched (the API answers 409 too).
        _say(f"error: nothing was launched: run {run_id} is {run.get('state')}; only a draft can be launched",
              file=sys.stderr)
        return 1
    _say(f"Run {run_id}: {offer.get('gpu', '?')} on {run.get('provider', '?')} "
          f"({offer.get('machine_type', '?')}, {offer.get('region', '?')})", file=talk)
    _say(f"Estimate: {_cell(estimate)} {offer.get('currency', 'USD')}/hour (your limit: {_cell(limit)}/hour); "
          f"runtime limit {duration(run.get('runtime_limit_s'))}", file=talk)
    if (forecast := forecast_line(run)) is not None:
        _say(forecast[:1].upper() + forecast[1:], file=talk)
    for w in run.get("warnings") or []:
        _say(f"Warning: {cli_words(w, run_id)}", file=talk)
    if run.get("billing_note"):
        _say(f"Note: {run['billing_note']}", file=talk)
    if not args.yes:
        if not sys.stdin.isatty():
            _say("error: not confirmed; pass --yes to launch without a prompt", file=sys.stderr)
            return 1
        if input("Launch and start billing in your account? [y/N] ").strip().lower() not in ("y", "yes"):
            _say("not launched")
            return 1
    run = client.post(f"/api/runs/{run_id}/launch", {"confirm": True})
    _emit(args, run, f"launched: {status_line(run)}" if isinstance(run, dict) else run)
    return 0


class _LogCursor:
    """Reads a run's log lines once each: with the API's `after` cursor where it has one,
    else by counting the lines already seen."""

    def __init__(self, client: Client, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.cursor: str | None = None
        self.seen = 0
        self.done = False  # the API said so (`next` null): the run ended and every line was read

    def new_lines(self) -> list[str]:
        if self.done:
            return []  # asking again would read the last page a second time
        data = self.client.get(f"/api/runs/{self.run_id}/logs", after=self.cursor or "")
        lines = [x if isinstance(x, str) else json.dumps(x, default=str) for x in _items(data, "lines")]
        if isinstance(data, dict) and "next" in data:  # paged: the answer holds only new lines
            if data.get("next"):
                self.cursor = str(data["next"])
            else:
                self.done = True
            return lines
        fresh = lines[self.seen:]
        self.seen = max(self.seen, len(lines))
        return fresh

    def rest(self) -> list[str]:
        """Every line not read yet (all pages), for a run that has ended."""
        lines: list[str] = []
        while fresh := self.new_lines():
            lines.extend(fresh)
        return lines


def _entered(run: dict[str, Any]) -> bool:
    """Whether the run's events hold its move into the state it is in ("releasing -> succeeded: ...")."""
    state = str(run.get("state", ""))
    return any(e.get("kind") == "transition" and (e.get("state") == state
                                                  or f" -> {state}" in str(e.get("message", "")).split(":", 1)[0])
               for e in run.get("events") or [])


def watch(client: Client, run_id: str, *, interval: float = 2.0, stream: TextIO | None = None,
          max_polls: int | None = None, logs: bool = True) -> int:
    """Follow a run until it stops: one line per state change with its time, the run's log
    lines (unless logs=False), under a live status block. 0 if it succeeded, 1 otherwise.

    On a terminal the status block is redrawn in place (lines above it scroll by); into a
    file or a pipe every line is printed once and the status only when it changes.
    """
    out = stream or sys.stdout
    tty = out.isatty()
    seen_events: set[tuple[str, str]] = set()
    cursor = _LogCursor(client, run_id) if logs else None
    drawn = 0  # lines of the status block on screen (a TTY only)
    last_status = ""
    polls = 0
    while True:
        # The log first, then the run: a line the run logged before it changed state is read no later
        # than that change, and printed above it (the last trainer and agent lines come before
        # "releasing -> succeeded", not after it).
        logged = cursor.new_lines() if cursor is not None else []
        run = client.get(f"/api/runs/{run_id}")
        late = 0
        while str(run.get("state", "")) in STOP_STATES and not _entered(run) and late < 5:
            # The API writes a run's new state a moment before the event that says so: read it again
            # rather than end without the line "releasing -> succeeded".
            late += 1
            time.sleep(min(interval, 0.2))
            run = client.get(f"/api/runs/{run_id}")
        if cursor is not None and str(run.get("state", "")) in STOP_STATES:
            logged += cursor.rest()  # it has ended: whatever it logged comes before how it ended
        lines = [f"  | {line}" for line in logged]
        for e in run.get("events") or []:
            key = (str(e.get("at")), str(e.get("message")))
            if e.get("kind") in ("transition", "warning") and key not in seen_events:
                seen_events.add(key)
                mark = "" if e.get("kind") == "transition" else "warning: "
                lines.append(f"{clock(e.get('at'))}  {mark}{cli_words(str(e.get('message')), run_id)}")
        lines = [printable(line) for line in lines]  # the block is printable already
        block = status_block(run)
        if tty:
            if drawn:
                out.write(f"\033[{drawn}F\033[J")  # to the block's first line, clear below
            for line in lines + block:
                out.write(line + "\n")
            drawn = len(block)
        else:
            for line in lines:
                out.write(line + "\n")
            # Printed when where the run is changes (not every poll), with its time and cost then.
            if block[0] != last_status:
                out.write(block[0] + "   " + block[1].strip() + "\n")
                last_status = block[0]
        out.flush()
        state = str(run.get("state", ""))
        if state in STOP_STATES:
            if not tty:
                for line in block[1:]:
                    out.write(line + "\n")
            if run.get("billing_note"):
                out.write(printable(f"billing: {run['billing_note']}") + "\n")
            outcome = run.get("outcome")
            cost = run.get("final_cost") if run.get("final_cost") is not None else run.get("cost_so_far")
            # Both times: a retained run's clock goes on while its GPU no longer bills.
            out.write(printable(f"run {run_id} {state}" + (f" (outcome: {outcome})" if outcome and outcome != state else "")
                                + f" after {duration(run.get('elapsed_s'))} (billed GPU "
                                + f"{duration(run.get('billed_machine_s'))}), cost {money(cost)}") + "\n")
            out.flush()
            return 0 if state == "succeeded" else 1
        polls += 1
        if max_polls is not None and polls >= max_polls:
            return 1
        time.sleep(interval)


def _logs(args: argparse.Namespace, client: Client) -> int:
    run_id = _run_id(args, client)
    cursor = _LogCursor(client, run_id)
    while True:
        for line in cursor.new_lines():
            _say(line)
        if not args.follow:
            return 0
        run = client.get(f"/api/runs/{run_id}")
        state = str(run.get("state"))
        if state in STOP_STATES:
            for line in cursor.new_lines():
                _say(line)
            # The end of a followed log says how the run ended (it may have ended long ago).
            _say(f"run {run_id} {state}" + (f": {run['reason']}" if run.get("reason") else ""))
            return 0 if state == "succeeded" else 1
        sys.stdout.flush()
        time.sleep(args.interval)


def _recover(args: argparse.Namespace, client: Client) -> int:
    run_id = _run_id(args, client)
    before = client.get(f"/api/runs/{run_id}")
    if args.upload:
        run = client.request("POST", f"/api/runs/{run_id}/recover", data=Path(args.upload).read_bytes(),
                             content_type="application/zip")
    else:
        mode = "start_machine" if args.start_machine else "resume" if args.resume else "verify_saved"
        run = client.post(f"/api/runs/{run_id}/recover", {"mode": mode})
    if not isinstance(run, dict):
        _say(run)
        return 0
    if args.start_machine or args.resume or args.no_wait:  # a resumed run is followed like any training run
        def started() -> None:
            _say(status_line(run))
            if run.get("billing_note"):
                _say(f"billing: {run['billing_note']}")

        _emit(args, run, started)
        return 0
    # Wait for the verdict: verification moves the run on (releasing -> succeeded) or back
    # to retained with the reason. A verdict is a new state change after our request.
    seen = {str(e.get("at")) for e in before.get("events") or [] if e.get("kind") == "transition"}
    deadline = time.monotonic() + args.timeout
    while True:
        fresh = [e for e in run.get("events") or [] if e.get("kind") == "transition"
                 and str(e.get("at")) not in seen and not str(e.get("message", "")).startswith("retained -> recovering")]
        state = str(run.get("state"))
        if state in ("releasing", "succeeded", "failed", "cancelled") or (state == "retained" and fresh):
            break
        if time.monotonic() > deadline:
            _say(f"error: no verdict within {args.timeout:.0f} s; the run is {state} "
                  f"(`tensorant runs get {run_id}` shows it later)", file=sys.stderr)
            return 1
        time.sleep(args.interval)
        run = client.get(f"/api/runs/{run_id}")
    ok = state in ("releasing", "succeeded")

    def text() -> None:
        if ok:
            _say(f"recovery verified: the adapter is good; run {run_id} is {state}"
                  + (" (the machine is being released)" if state == "releasing" else ""))
        else:
            _say(f"recovery failed: {run.get('reason') or 'the adapter was refused'}; run {run_id} stays {state}")
            if run.get("billing_note"):
                _say(f"billing: {run['billing_note']}")

    _emit(args, run, text)
    return 0 if ok else 1


# The Functions host reserves routes that start with "admin", so the admin API lives here.
ADMIN = "/api/platform"


def cmd_admin(args: argparse.Namespace, client: Client) -> int:
    if args.action == "queues":
        data = client.get(f"{ADMIN}/queues")
        _emit(args, data, lambda: _table(_items(data, "queues"), ["name", "length", "poison_length"]),
              ids=[str(q.get("name")) for q in _items(data, "queues")])
    elif args.action == "poison":
        q = args.queue
        if args.poison_action == "list":
            data = client.get(f"{ADMIN}/queues/{q}/poison")
            _emit(args, data, lambda: _table(_items(data, "messages"), [
                "id", "run_id", "org", "dequeue_count", "inserted_on", "last_error"], empty="(no poison messages)"))
        elif args.poison_action == "replay":
            result = client.post(f"{ADMIN}/queues/{q}/poison/replay", {"message_id": args.id})
            replayed = result.get("replayed") if isinstance(result, dict) else None
            if isinstance(replayed, list):
                _say(f"replayed {len(replayed)} message(s) onto {q}" + (f": {', '.join(replayed)}" if replayed else ""))
            else:
                print(json.dumps(result, default=str))
        else:
            client.delete(f"{ADMIN}/queues/{q}/poison/{args.id}")
            _say(f"discarded {args.id} from {q}-poison")
    elif args.action == "sweep":
        _out(args, client.post(f"{ADMIN}/sweep", {"dry_run": not args.apply}))
    return 0


# ---------------------------------------------------------------- parser

FORMATTER = argparse.RawDescriptionHelpFormatter


def _leaf(sub: Any, name: str, help_: str, example: str, *, objects: bool = True,
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


def _group(sub: Any, name: str, help_: str) -> Any:
    return sub.add_parser(name, help=help_, description=help_).add_subparsers(dest="action", required=True,
                                                                              metavar="ACTION")


def _run_fields(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--dataset", required=required, help="dataset version id (`tensorant datasets list`)")
    p.add_argument("--provider", required=required)
    p.add_argument("--offer", required=required, help="offer id from `tensorant catalog`")
    p.add_argument("--base-model", required=required, help="a declared base model id")
    p.add_argument("--price-limit", type=float, required=required, help="USD per hour")
    p.add_argument("--runtime-limit", type=int, help="seconds")
    p.add_argument("--kind", choices=["trial", "full"], default=None, help="trial (default) or full")
    p.add_argument("--training-json", metavar="JSON", help='training settings, e.g. \'{"lora_r": 8}\'')
    p.add_argument("--set-training", action="append", metavar="KEY=VALUE",
                   help="one training setting (repeatable), e.g. --set-training max_steps=20")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorant", description=__doc__.split("\n\n")[0],
                                epilog="example:\n  tensorant runs list\n  tensorant runs watch --last",
                                formatter_class=FORMATTER)
    p.add_argument("--url", default=os.environ.get("TENSORANT_URL", "http://localhost:7071"),
                   help="control plane URL (env TENSORANT_URL)")
    p.add_argument("--token", default=os.environ.get("TENSORANT_TOKEN"), help="bearer token (env TENSORANT_TOKEN)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = _leaf(sub, "dev-token", "mint a development token with the local JWT secret (prints it only)",
              "export TENSORANT_TOKEN=$(tensorant dev-token --org demo --role owner)", objects=False)
    # The org `make run` prints a token for and the README's quickstart uses: one org throughout.
    t.add_argument("--org", default="demo")
    t.add_argument("--role", default="owner", choices=["owner", "member", "admin"])
    t.add_argument("--sub", default="dev-user")
    t.add_argument("--ttl", type=int, default=12 * 3600, help="lifetime in seconds")
    t.set_defaults(fn=cmd_dev_token)

    c = _group(sub, "connections", "compute and storage connections")
    for name, help_, example in (
            ("save-compute", "save a compute connection (values typed by the API schema)",
             "tensorant connections save-compute local --set price_per_hour=0 --wait\n"
             "tensorant connections save-compute aws --from-file aws.json --set workspace_disk_gb=200"),
            ("save-storage", "save the organization's storage",
             "tensorant connections save-storage --set kind=local")):
        s = _leaf(c, name, help_, example)
        if name == "save-compute":
            s.add_argument("provider", help="aws, azure, runpod or local")
        s.add_argument("--from-file", "--file", dest="from_file", metavar="JSON_FILE",
                       help="the whole connection body as a JSON file")
        s.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="set a field, typed by the schema (repeatable; a.b=c nests)")
        if name == "save-compute":
            s.add_argument("--wait", action="store_true",
                           help="wait for the checks and the catalog; exit 1 if the connection failed")
    _leaf(c, "show", "all of the organization's connections and their checks", "tensorant connections show")
    ck = _leaf(c, "check", "check a compute connection again", "tensorant connections check aws --wait")
    ck.add_argument("provider")
    ck.add_argument("--wait", action="store_true", help="wait for the verdict; exit 1 if the connection failed")
    _leaf(c, "delete", "delete a compute connection", "tensorant connections delete aws",
          objects=False).add_argument("provider")
    for s in c.choices.values():
        s.set_defaults(fn=cmd_connections)

    pr = _group(sub, "projects", "projects")
    _leaf(pr, "create", "create a project", "PROJECT=$(tensorant projects create demo -q)").add_argument("name")
    _leaf(pr, "list", "list projects", "tensorant projects list")
    for s in pr.choices.values():
        s.set_defaults(fn=cmd_projects)

    ds = _group(sub, "datasets", "dataset versions (JSONL)")
    up = _leaf(ds, "upload", "upload a JSONL file as a new dataset version",
               "DATASET=$(tensorant datasets upload \"$PROJECT\" train.jsonl -q)")
    up.add_argument("project_id")
    up.add_argument("file")
    dl = _leaf(ds, "list", "list dataset versions (of one project, or of all)", "tensorant datasets list")
    dl.add_argument("project_id", nargs="?")
    for s in ds.choices.values():
        s.set_defaults(fn=cmd_datasets)

    cat = _leaf(sub, "catalog", "GPU offers with prices per hour",
                "tensorant catalog --provider aws | head\nOFFER=$(tensorant catalog --provider local -q | head -n1)")
    cat.add_argument("--provider")
    cat.set_defaults(fn=cmd_catalog)

    us = _leaf(sub, "usage", "runs, GPU hours and cost per provider since a date",
               "tensorant usage --since 2026-01-01")
    us.add_argument("--since", help="ISO date (default: 30 days ago)")
    us.set_defaults(fn=cmd_usage)

    r = _group(sub, "runs", "training runs")
    cr = _leaf(r, "create", "save a draft run with its estimate (nothing is rented)",
               "tensorant runs create --project \"$PROJECT\" --dataset \"$DATASET\" --provider local \\\n"
               "    --offer local-smoke --base-model tensorant/smoke-tiny --price-limit 1 -q")
    cr.add_argument("--project", required=True)
    _run_fields(cr, required=True)
    ed = _leaf(r, "edit", "change fields of a draft", "tensorant runs edit --last --price-limit 2", run_id=True)
    _run_fields(ed, required=False)
    _leaf(r, "list", "list runs: state, progress, cost, duration, reason", "tensorant runs list")
    _leaf(r, "get", "a run: state, time, cost, resources, loss sparkline, history", "tensorant runs get --last",
          run_id=True)
    _leaf(r, "release", "retry a release the cloud has not confirmed", "tensorant runs release --last", run_id=True)
    _leaf(r, "delete", "delete a draft", "tensorant runs delete --last", run_id=True)
    la = _leaf(r, "launch", "show the estimate and launch (asks unless --yes)", "tensorant runs launch --last --yes",
               run_id=True)
    la.add_argument("--yes", action="store_true", help="launch without asking")
    w = _leaf(r, "watch", "follow state changes, logs, time and cost; exit 0 only if the run succeeds",
              "tensorant runs watch --last\ntensorant runs watch r-123 --no-logs", objects=False, run_id=True)
    w.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    w.add_argument("--no-logs", action="store_true", help="do not stream the run's log lines")
    lg = _leaf(r, "logs", "the run's log lines (-f follows until the run ends)", "tensorant runs logs --last -f",
               objects=False, run_id=True)
    lg.add_argument("--follow", "-f", action="store_true")
    lg.add_argument("--interval", type=float, default=2.0)
    ca = _leaf(r, "cancel", "cancel; a run that may hold output needs --discard or --keep",
               "tensorant runs cancel --last --keep\ntensorant runs cancel --last --discard --yes",
               objects=False, run_id=True)
    what = ca.add_mutually_exclusive_group()
    what.add_argument("--keep", action="store_true", help="stop the machine and keep its disk for recovery")
    what.add_argument("--discard", action="store_true",
                      help="delete the machine and disk with any output on them (asks unless --yes)")
    ca.add_argument("--yes", action="store_true", help="discard without a prompt")
    _leaf(r, "stop", "stop a retained machine that was started for recovery (its disk is kept)",
          "tensorant runs stop --last", objects=False, run_id=True)
    rc = _leaf(r, "recover", "recover a retained run; waits for the verification verdict",
               "tensorant runs recover --last --upload adapter.zip", run_id=True)
    how = rc.add_mutually_exclusive_group(required=True)
    how.add_argument("--upload", metavar="ADAPTER_ZIP")
    how.add_argument("--verify-saved", action="store_true", help="verify the adapter already in storage")
    how.add_argument("--start-machine", action="store_true",
                     help="start the retained machine to fetch files from it (GPU billing resumes; training does not)")
    how.add_argument("--resume", action="store_true",
                     help="start the retained machine and continue training from its last checkpoint to the planned "
                          "steps (GPU billing resumes; the runtime limit counts again from now)")
    rc.add_argument("--no-wait", action="store_true", help="return at once instead of waiting for the verdict")
    rc.add_argument("--timeout", type=float, default=600, help="seconds to wait for the verdict")
    rc.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    for s in r.choices.values():
        s.set_defaults(fn=cmd_runs)
    dl = _leaf(r, "download", "save the verified adapter of a succeeded run (adapter.zip)",
               "tensorant runs download --last -o adapter.zip", objects=False, run_id=True)
    dl.add_argument("-o", "--output", metavar="FILE", help="default: <RUN_ID>-adapter.zip")
    dl.set_defaults(fn=cmd_runs_download)
    bm = _leaf(sub, "base-models", "declared base models: shapes, parameters, GPU memory of a LoRA run",
               "tensorant base-models")
    bm.set_defaults(fn=cmd_base_models)

    ad = _group(sub, "admin", "platform admin: queues, poison messages, sweeper")
    _leaf(ad, "queues", "queue lengths and their poison queues", "tensorant admin queues")
    po = ad.add_parser("poison", help="poison messages", description="poison messages").add_subparsers(
        dest="poison_action", required=True, metavar="ACTION")
    _leaf(po, "list", "a queue's poison messages", "tensorant admin poison list launch").add_argument("queue")
    rp = _leaf(po, "replay", "put poison messages back on their queue", "tensorant admin poison replay launch --id m1")
    rp.add_argument("queue")
    rp.add_argument("--id", help="one message (default: all)")
    dc = _leaf(po, "discard", "delete one poison message", "tensorant admin poison discard launch --id m1",
               objects=False)
    dc.add_argument("queue")
    dc.add_argument("--id", required=True)
    for s in po.choices.values():
        s.set_defaults(fn=cmd_admin, action="poison")
    sw = _leaf(ad, "sweep", "find leaked resources (dry run unless --apply)", "tensorant admin sweep --dry-run")
    mode = sw.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", default=True)
    mode.add_argument("--apply", action="store_true")
    for name, s in ad.choices.items():
        if name != "poison":
            s.set_defaults(fn=cmd_admin)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    client = Client(args.url, args.token)
    try:
        code: int = args.fn(args, client)
        sys.stdout.flush()
    except ApiError as exc:
        # Rendered line by line, in the CLI's words; a hint that names the run names this one.
        print(exc.render(run_id=str(getattr(args, "id", None) or "<RUN_ID>")), file=sys.stderr)
        return 1
    except UsageError as exc:
        _say(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`tensorant catalog | head`): stop quietly, as other tools do.
        # Python would report the pipe again at exit when it flushes stdout, so point it at devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:  # a file that cannot be read
        _say(f"error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
