"""`tensorant runs ...`: training runs, from a draft to a downloaded adapter (following a run,
`runs watch` and `runs logs`, is in watch.py)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from tensorant_cli.client import ApiError, Client
from tensorant_cli.commands.common import UsageError, group, leaf, run_id_of
from tensorant_cli.commands.watch import logs, watch
from tensorant_cli.output import cell, emit, items, say, short, table
from tensorant_cli.render import (
    adapter_line,
    attempt_line,
    candidate_lines,
    candidate_text,
    cli_words,
    clock,
    duration,
    event_text,
    forecast_check_line,
    forecast_line,
    money,
    next_steps,
    percent,
    preference_line,
    printable,
    sparkline,
    status_block,
    status_line,
)


def add_parser(sub: Any) -> None:
    r = group(sub, "runs", "training runs")
    cr = leaf(r, "create", "save a draft run with its estimate (nothing is rented)",
              "tensorant runs create --project \"$PROJECT\" --dataset \"$DATASET\" --provider local \\\n"
              "    --offer local-smoke --base-model tensorant/smoke-tiny --price-limit 1 -q")
    cr.add_argument("--project", required=True)
    _run_fields(cr, required=True)
    cr.add_argument("--fallback", choices=["none", "fitting"], default=None, help=(
        "fitting: also accept every offer of your connected accounts that holds the model and is under the price "
        "limit (up to 8 candidates in all), cheapest forecast cost first"))
    ed = leaf(r, "edit", "change fields of a draft", "tensorant runs edit --last --price-limit 2", run_id=True)
    _run_fields(ed, required=False)
    ls = leaf(r, "list", "list runs, newest first: state, progress, cost, duration, reason (a page at a time)",
              "tensorant runs list\ntensorant runs list --state training,retained --limit 20\n"
              "tensorant runs list --all")
    ls.add_argument("--limit", type=int, help="runs per page (the API's default 50, at most 200)")
    ls.add_argument("--state", help="only runs in these states (comma-separated)")
    ls.add_argument("--project", help="only this project's runs")
    ls.add_argument("--cursor", help="the page after the one that printed this cursor")
    ls.add_argument("--all", action="store_true", help="every page, following the cursor")
    leaf(r, "get", "a run: state, time, cost, resources, loss sparkline, history", "tensorant runs get --last",
         run_id=True)
    leaf(r, "release", "retry a release the cloud has not confirmed", "tensorant runs release --last", run_id=True)
    de = leaf(r, "delete", "delete a draft; with --yes a run that holds a machine is discarded as "
              "`runs cancel --discard --yes` does", "tensorant runs delete --last", run_id=True)
    de.add_argument("--yes", action="store_true",
                    help="a run that is not a draft: delete its machine and disk, with any output on them")
    la = leaf(r, "launch", "show the estimate and launch (asks unless --yes)", "tensorant runs launch --last --yes",
              run_id=True)
    la.add_argument("--yes", action="store_true", help="launch without asking")
    w = leaf(r, "watch", "follow state changes, logs, time and cost; exit 0 only if the run succeeds",
             "tensorant runs watch --last\ntensorant runs watch r-123 --no-logs", objects=False, run_id=True)
    w.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    w.add_argument("--no-logs", action="store_true", help="do not stream the run's log lines")
    lg = leaf(r, "logs", "the run's log lines (-f follows until the run ends)", "tensorant runs logs --last -f",
              objects=False, run_id=True)
    lg.add_argument("--follow", "-f", action="store_true")
    lg.add_argument("--interval", type=float, default=2.0)
    ca = leaf(r, "cancel", "cancel; a run that may hold output needs --discard or --keep",
              "tensorant runs cancel --last --keep\ntensorant runs cancel --last --discard --yes",
              objects=False, run_id=True)
    what = ca.add_mutually_exclusive_group()
    what.add_argument("--keep", action="store_true", help="stop the machine and keep its disk for recovery")
    what.add_argument("--discard", action="store_true",
                      help="delete the machine and disk with any output on them (asks unless --yes)")
    ca.add_argument("--yes", action="store_true", help="discard without a prompt")
    leaf(r, "stop", "stop a retained machine that was started for recovery (its disk is kept)",
         "tensorant runs stop --last", objects=False, run_id=True)
    rc = leaf(r, "recover", "recover a retained run; waits for the verification verdict (--resume: follows the "
              "run to its end as `runs watch` does; --start-machine: returns once the machine starts)",
              "tensorant runs recover --last --upload adapter.zip", run_id=True)
    how = rc.add_mutually_exclusive_group(required=True)
    how.add_argument("--upload", metavar="ADAPTER_ZIP")
    how.add_argument("--verify-saved", action="store_true", help="verify the adapter already in storage")
    how.add_argument("--start-machine", action="store_true",
                     help="start the retained machine to fetch files from it (GPU billing resumes; training does not)")
    how.add_argument("--resume", action="store_true",
                     help="start the retained machine and continue training from its last checkpoint to the planned "
                          "steps (GPU billing resumes; the runtime limit counts again from now)")
    rc.add_argument("--accept-checkpoint", action="store_true",
                    help="with --verify-saved or --upload: let a checkpoint's adapter (training stopped before its "
                         "planned steps) end the run, marked as a checkpoint; without it such an archive is refused")
    rc.add_argument("--no-wait", action="store_true", help="return at once instead of waiting for the verdict")
    rc.add_argument("--timeout", type=float, default=600, help="seconds to wait for the verdict")
    rc.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    for s in r.choices.values():
        s.set_defaults(fn=cmd_runs)
    dl = leaf(r, "download", "save the verified adapter of a succeeded run (adapter.zip)",
              "tensorant runs download --last -o adapter.zip", objects=False, run_id=True)
    dl.add_argument("-o", "--output", metavar="FILE", help="default: <RUN_ID>-adapter.zip (<RUN_ID>-merged.zip)")
    dl.add_argument("--merged", action="store_true",
                    help="the adapter merged into the base model's weights (a run with training.merged)")
    dl.set_defaults(fn=cmd_runs_download)


def _run_fields(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--dataset", required=required, help="dataset version id (`tensorant datasets list`)")
    p.add_argument("--provider", help="the provider of a plain offer id (not needed when every --offer names "
                   "its connection)")
    p.add_argument("--connection", help="the provider's compute connection to run on: `{provider}` (the default) or "
                   "`{provider}/{name}`, e.g. aws/us-west-2 (`tensorant connections show`); plain offers use it")
    p.add_argument("--offer", required=required, help=(
        "offer id from `tensorant catalog`; several, comma-separated, are candidates tried in order when a cloud "
        "has no capacity, quota or stock: each CONNECTION:OFFER (aws:us-east-1/us-east-1a/g6.xlarge, "
        "aws/us-west-2:...) or a plain offer on --provider"))
    p.add_argument("--capacity-wait", type=int, metavar="SECONDS", help=(
        "when every candidate refused: keep trying them again (backing off) this long before the run fails"))
    p.add_argument("--base-model", required=required, help="a declared base model id, or a Hub id with --base-model-revision")
    p.add_argument("--base-model-revision", metavar="REV",
                   help="the Hub revision of --base-model (a commit id, or a branch resolved to its commit at create)")
    p.add_argument("--price-limit", type=float, required=required, help="USD per hour")
    p.add_argument("--runtime-limit", type=int, help="seconds")
    p.add_argument("--kind", choices=["trial", "full"], default=None, help="trial (default) or full")
    p.add_argument("--training-json", metavar="JSON", help='training settings, e.g. \'{"lora_r": 8}\'')
    p.add_argument("--set-training", action="append", metavar="KEY=VALUE",
                   help="one training setting (repeatable), e.g. --set-training max_steps=20")


_CONNECTION = re.compile(r"^[a-z][a-z0-9_-]{0,31}(/[a-z0-9][a-z0-9-]{0,39})?$")


def parse_offers(text: str, provider: str | None) -> list[dict[str, str]]:
    """`--offer a,b,c`: each entry CONNECTION:OFFER or a plain offer id on --provider, as the API's candidates.
    An Azure offer id is itself azure:<region>:<size>: after a bare `azure:` it is read whole."""
    out = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            raise UsageError(f"--offer: an empty entry in {text!r}; separate offers with single commas")
        prefix, sep, rest = entry.partition(":")
        if sep and rest and _CONNECTION.match(prefix) and not (prefix == "azure" and not rest.startswith("azure:")):
            out.append({"connection": prefix, "offer_id": rest})
        elif provider:
            out.append({"connection": provider, "offer_id": entry})
        elif prefix == "azure" and sep:
            out.append({"connection": "azure", "offer_id": entry})
        else:
            raise UsageError(f"--offer {entry}: say its connection (CONNECTION:OFFER, e.g. aws:{entry}) or give "
                             "--provider")
    return out


def _run_create_body(args: argparse.Namespace, partial: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "project_id": getattr(args, "project", None), "dataset_version_id": args.dataset, "provider": args.provider,
        "offer_id": None, "base_model": args.base_model, "price_limit_per_hour": args.price_limit,
        "kind": args.kind, "runtime_limit_s": args.runtime_limit, "capacity_wait_s": args.capacity_wait,
        "fallback": getattr(args, "fallback", None), "base_model_revision": getattr(args, "base_model_revision", None),
        "connection": getattr(args, "connection", None)}
    if args.offer:
        offers = parse_offers(args.offer, getattr(args, "connection", None) or args.provider)
        first = offers[0]
        fields["provider"], fields["offer_id"] = first["connection"].split("/", 1)[0], first["offer_id"]
        if len(offers) > 1 or "/" in first["connection"]:
            fields["candidates"] = offers
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
        say(line)
    say(f"  estimate {money(run.get('estimate_per_hour'), currency)}/h (limit "
        f"{money(run.get('price_limit_per_hour'), currency)}/h); runtime limit "
        f"{duration(run.get('runtime_limit_s'))}; base model {run.get('base_model')}; kind {run.get('kind')}")
    if (forecast := forecast_line(run)) is not None:
        say(f"  {forecast}")
    if (checked := forecast_check_line(run)) is not None:
        say(f"  {checked}")
    if run.get("final_cost") is not None:
        say(f"  final cost {money(run['final_cost'], currency)}: machine {duration(run.get('billed_machine_s'))}"
            f", disk only {duration(run.get('billed_disk_only_s'))}")
    for key in ("started_at", "machine_up_at", "released_at"):
        if run.get(key):
            say(f"  {key.replace('_at', '').replace('_', ' ')}: {run[key]}")
    for w in run.get("warnings") or []:
        say(f"  warning: {cli_words(w, str(run.get('id')))}")
    if run.get("billing_note"):
        say(f"  billing: {run['billing_note']}")
    if run.get("release_error"):
        say(f"  release error (attempt {run.get('release_attempts')}): {run['release_error']}")
    for line in candidate_lines(run):
        say(f"  {line}")
    for attempt in run.get("attempts") or []:
        say(f"  {printable(attempt_line(attempt))}")
    for res in run.get("resources") or []:
        say(f"  resource {res.get('kind')} {res.get('id')}: {res.get('state') or '-'}")
    for line in next_steps(run):
        say(f"  {line}")
    if run.get("adapter_sha256"):
        say(f"  adapter sha256 {run['adapter_sha256']}")
    if client is not None and run.get("state") != "draft":
        try:
            answer = client.get(f"/api/runs/{run['id']}/metrics")
        except ApiError:
            answer = {}
        points = items(answer, "points")
        losses = [float(p["loss"]) for p in points if isinstance(p, dict) and p.get("loss") is not None]
        if losses:
            say(f"  loss {sparkline(losses)}  {losses[0]:.4g} -> {losses[-1]:.4g} over {len(losses)} steps")
        # The evaluations during training (eval_every_steps), beside the loss.
        evals = [float(p["eval_loss"]) for p in (answer.get("eval_points") if isinstance(answer, dict) else None) or []
                 if isinstance(p, dict) and p.get("eval_loss") is not None]
        if evals:
            say(f"  eval {sparkline(evals)}  {evals[0]:.4g} -> {evals[-1]:.4g} over {len(evals)} evaluations")
        # A DPO run's held-out preference accuracy per evaluation, and the last reward margin.
        if (preference := preference_line(answer)) is not None:
            say(f"  {preference}")
    # An attempt's refusal is said by its attempt line above.
    events = [e for e in run.get("events") or [] if e.get("kind") in ("transition", "warning")
              and (e.get("data") or {}).get("type") != "run.attempt_refused"]
    if events:
        say("  history:")
        said = ""
        for e in events:
            message, said = event_text(e, said)
            say(f"    {clock(e.get('at'))}  {cli_words(message, str(run.get('id')))}")


def _run_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in runs:
        cost = r.get("final_cost") if r.get("final_cost") is not None else r.get("cost_so_far")
        currency = str((r.get("offer") or {}).get("currency") or "USD")
        rows.append({**r, "progress": percent(r.get("progress")), "cost": money(cost, currency),
                     "elapsed": duration(r.get("elapsed_s")), "billed_gpu": duration(r.get("billed_machine_s")),
                     "reason": short(r.get("reason"), 50)})
    return rows


def cmd_runs(args: argparse.Namespace, client: Client) -> int:
    a = args.action
    if a == "create":
        run = client.post("/api/runs", _run_create_body(args, partial=False))

        def text() -> None:
            say(f"created run {run.get('id')} (state {run.get('state')}); estimate "
                f"{money(run.get('estimate_per_hour'))}/h")
            if (forecast := forecast_line(run)) is not None:
                say(forecast)
            for w in run.get("warnings") or []:
                say(f"warning: {cli_words(w, str(run.get('id')))}")

        emit(args, run, text)
    elif a == "list":
        params = {"limit": str(args.limit or ""), "state": args.state or "", "project": args.project or "",
                  "cursor": args.cursor or ""}
        data = client.get("/api/runs", **params)
        while args.all and isinstance(data, dict) and data.get("next"):
            more = client.get("/api/runs", **{**params, "cursor": data["next"]})
            data = {**more, "items": data["items"] + more["items"]}
        # Elapsed and billed GPU time apart: a retained run's clock goes on, its GPU bill does not.
        emit(args, data, lambda: table(_run_rows(items(data, "runs")), [
             "id", "kind", "state", "progress", "cost", "elapsed", "billed_gpu", "provider", "created_at", "reason"],
            empty="(no runs)", headers={"billed_gpu": "billed gpu"}))
        if isinstance(data, dict) and data.get("next") and not args.json:
            print(f"more: tensorant runs list --cursor {data['next']} (or --all)", file=sys.stderr)
    elif a == "get":
        run = client.get(f"/api/runs/{run_id_of(args, client)}")
        emit(args, run, lambda: _show_run(run, client))
    elif a == "edit":
        body = _run_create_body(args, partial=True)
        if not body:
            raise UsageError("give at least one field to change (e.g. --price-limit 2)")
        run = client.request("PATCH", f"/api/runs/{run_id_of(args, client)}", body=body)
        emit(args, run, lambda: _show_run(run))
    elif a == "delete":
        return _delete(args, client)
    elif a == "launch":
        return _launch(args, client)
    elif a == "watch":
        return watch(client, run_id_of(args, client), interval=args.interval, stream=sys.stdout,
                     logs=not args.no_logs)
    elif a == "logs":
        return logs(args, client)
    elif a == "cancel":
        return _cancel(args, client)
    elif a == "stop":
        run = client.post(f"/api/runs/{run_id_of(args, client)}/stop")
        say(status_line(run) if isinstance(run, dict) else run)
        if isinstance(run, dict) and run.get("billing_note"):
            say(f"billing: {run['billing_note']}")
    elif a == "recover":
        return _recover(args, client)
    elif a == "release":
        run = client.post(f"/api/runs/{run_id_of(args, client)}/release")
        emit(args, run, status_line(run) if isinstance(run, dict) else run)
    return 0


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


def cmd_runs_download(args: argparse.Namespace, client: Client) -> int:
    """Save the run's verified adapter (--merged: its merged model): streamed (local storage) or fetched from
    its short-lived URL, written to a temporary file and kept only when its sha256 is the verified one."""
    args.id = run_id_of(args, client)
    what = "merged" if args.merged else "adapter"
    resp = client.stream(f"/api/runs/{args.id}/adapter", params={"format": "merged"} if args.merged else None,
                         accept="application/zip, application/json, application/problem+json")
    if resp.headers.get("Content-Type", "").startswith("application/zip"):
        body, expected = resp, resp.headers.get("X-Adapter-Sha256", "")
    else:
        link = resp.json()
        body = client.fetch(link["url"], timeout=max(client.timeout, 300))  # presigned: no Authorization
        expected = str(link.get("sha256") or "")
    out = Path(args.output or f"{args.id}-{what}.zip")
    sha, size = _save_checked(body, out, expected, what)
    say(f"saved {out} ({size} bytes, sha256 {sha})")
    return 0


def _save_checked(resp: Any, out: Path, expected: str, what: str) -> tuple[str, int]:
    """The response body written to out through out.part (a merged model is gigabytes: never held whole),
    renamed only when its sha256 is `expected`."""
    import hashlib

    digest, size, part = hashlib.sha256(), 0, out.with_name(out.name + ".part")
    with open(part, "wb") as f:
        for chunk in resp.iter_content(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
            f.write(chunk)
    sha = digest.hexdigest()
    if expected and sha != expected:
        part.unlink()
        raise ApiError(0, f"the download does not match the verified {what}",
                       f"sha256 {sha}, expected {expected}; nothing was saved")
    part.replace(out)
    return sha, size


ENDED = ("succeeded", "failed", "cancelled")


def _cancel(args: argparse.Namespace, client: Client) -> int:
    """--keep keeps the disk; --discard deletes machine, disk and any output on them (asked
    first on a terminal); neither: the API decides, and refuses for a run that may hold output."""
    args.id = run_id_of(args, client)
    try:
        current = client.get(f"/api/runs/{args.id}")
    except ApiError:
        current = None  # the cancel itself says what is wrong
    if isinstance(current, dict) and current.get("state") in ENDED:
        # The API answers an ended run's cancel with the run as it is; saying nothing made it look done.
        say(f"error: nothing to cancel: run {args.id} already ended {current.get('state')}", file=sys.stderr)
        return 1
    body: dict[str, Any] = {}
    if args.keep:
        body["discard"] = False
    elif args.discard:
        if not args.yes:
            if not sys.stdin.isatty():
                say("error: not confirmed; --discard deletes the machine, its disk and any adapter on it: "
                    "pass --yes as well to discard without a prompt", file=sys.stderr)
                return 1
            answer = input(f"Discard run {args.id}: delete its machine and disk, with any adapter on them? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                say("not cancelled")
                return 1
        body["discard"] = True
    run = client.post(f"/api/runs/{args.id}/cancel", body)
    say(status_line(run) if isinstance(run, dict) else run)
    return 0


def _delete(args: argparse.Namespace, client: Client) -> int:
    """A draft is deleted. A run that holds a machine (queued to retained) cannot be deleted, only
    discarded: with --yes that is what `runs delete` means, so it does what `runs cancel --discard --yes`
    does (the run stays as the record of what was billed); without --yes the refusal names that command.
    An ended run stays as a record: the API says so."""
    run_id = args.id = run_id_of(args, client)
    try:
        current = client.get(f"/api/runs/{run_id}")
    except ApiError:
        current = None  # the delete itself says what is wrong
    state = current.get("state") if isinstance(current, dict) else None
    if state is not None and state != "draft" and state not in ENDED:
        if not args.yes:
            say(f"error: run {run_id} is {state}, not a draft: nothing was deleted. To delete its machine and disk "
                f"(with any output on them) run `tensorant runs cancel {run_id} --discard --yes` (or `runs delete "
                f"{run_id} --yes`); to keep the disk for recovery, `tensorant runs cancel {run_id} --keep`",
                file=sys.stderr)
            return 1
        run = client.post(f"/api/runs/{run_id}/cancel", {"discard": True})
        emit(args, run, lambda: say(f"run {run_id} was {state}, not a draft: cancelled with its machine and disk "
                                    "discarded (it stays as the record of what was billed)\n"
                                    + (status_line(run) if isinstance(run, dict) else str(run))))
        return 0
    client.delete(f"/api/runs/{run_id}")
    emit(args, {"id": run_id, "deleted": True}, f"deleted draft {run_id}")
    return 0


def _launch(args: argparse.Namespace, client: Client) -> int:
    run_id = args.id = run_id_of(args, client)  # an error's hint names it (`tensorant runs edit <id> ...`)
    run = client.get(f"/api/runs/{run_id}")
    offer = run.get("offer") or {}
    estimate = run.get("estimate_per_hour", offer.get("total_per_hour"))
    limit = run.get("price_limit_per_hour")
    talk = sys.stderr if (args.json or args.quiet) else sys.stdout
    if run.get("state") != "draft":
        # Said before any prompt: nothing would be launched (the API answers 409 too).
        say(f"error: nothing was launched: run {run_id} is {run.get('state')}; only a draft can be launched",
              file=sys.stderr)
        return 1
    say(f"Run {run_id}: {offer.get('gpu', '?')} on {run.get('provider', '?')} "
        f"({offer.get('machine_type', '?')}, {offer.get('region', '?')})", file=talk)
    say(f"Estimate: {cell(estimate)} {offer.get('currency', 'USD')}/hour (your limit: {cell(limit)}/hour); "
        f"runtime limit {duration(run.get('runtime_limit_s'))}", file=talk)
    if (forecast := forecast_line(run)) is not None:
        say(forecast[:1].upper() + forecast[1:], file=talk)
    listed = run.get("candidates") or []
    if len(listed) > 1:
        # The launch may end on any candidate: the dearest's price and what the run can cost on it at most.
        dearest = max(listed, key=lambda c: float(c.get("total_per_hour") or 0))
        most = float(dearest.get("total_per_hour") or 0) * float(run.get("runtime_limit_s") or 0) / 3600
        say("Candidates, tried in order when a cloud has no capacity, quota or stock: "
            + "; ".join(candidate_text(c) for c in listed), file=talk)
        say(f"The dearest is {candidate_text(dearest)}: at most {money(most)} for the runtime limit on it", file=talk)
    for w in run.get("warnings") or []:
        say(f"Warning: {cli_words(w, run_id)}", file=talk)
    if run.get("billing_note"):
        say(f"Note: {run['billing_note']}", file=talk)
    if not args.yes:
        if not sys.stdin.isatty():
            say("error: not confirmed; pass --yes to launch without a prompt", file=sys.stderr)
            return 1
        if input("Launch and start billing in your account? [y/N] ").strip().lower() not in ("y", "yes"):
            say("not launched")
            return 1
    run = client.post(f"/api/runs/{run_id}/launch", {"confirm": True})
    emit(args, run, f"launched: {status_line(run)}" if isinstance(run, dict) else run)
    return 0


def _recover(args: argparse.Namespace, client: Client) -> int:
    run_id = run_id_of(args, client)
    before = client.get(f"/api/runs/{run_id}")
    if args.accept_checkpoint and (args.start_machine or args.resume):
        raise UsageError("--accept-checkpoint goes with --verify-saved or --upload (a verification)")
    if args.upload:
        run = client.request("POST", f"/api/runs/{run_id}/recover", data=Path(args.upload).read_bytes(),
                             content_type="application/zip",
                             params={"accept_checkpoint": "true"} if args.accept_checkpoint else None)
    else:
        mode = "start_machine" if args.start_machine else "resume" if args.resume else "verify_saved"
        body: dict[str, Any] = {"mode": mode}
        if args.accept_checkpoint:
            body["accept_checkpoint"] = True
        run = client.post(f"/api/runs/{run_id}/recover", body)
    if not isinstance(run, dict):
        say(run)
        return 0
    if args.resume and not args.no_wait:
        # A resumed run trains again: followed as `runs watch` follows one, to its end.
        say(status_line(run), file=sys.stderr if args.json else sys.stdout)
        return watch(client, run_id, interval=args.interval)
    if args.start_machine or args.resume or args.no_wait:
        def started() -> None:
            say(status_line(run))
            if run.get("billing_note"):
                say(f"billing: {run['billing_note']}")

        emit(args, run, started)
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
            say(f"error: no verdict within {args.timeout:.0f} s; the run is {state} "
                f"(`tensorant runs get {run_id}` shows it later)", file=sys.stderr)
            return 1
        time.sleep(args.interval)
        run = client.get(f"/api/runs/{run_id}")
    ok = state in ("releasing", "succeeded")

    def text() -> None:
        released = " (the machine is being released)" if state == "releasing" else ""
        if ok and (adapter := adapter_line(run)) is not None:
            say(f"recovery verified, with a checkpoint: {adapter.removeprefix('adapter: ')}; run {run_id} is "
                f"{state}{released}")
        elif ok:
            say(f"recovery verified: the adapter is good; run {run_id} is {state}{released}")
        else:
            say(f"recovery failed: {cli_words(run.get('reason') or 'the adapter was refused', run_id)}; run {run_id} "
                f"stays {state}")
            if run.get("billing_note"):
                say(f"billing: {run['billing_note']}")

    emit(args, run, text)
    return 0 if ok else 1

