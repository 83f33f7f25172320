"""Following a run: `tensorant runs watch` (state changes, logs, time and cost until it stops)
and `tensorant runs logs` (its log lines, -f until it ends)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from tensorant_cli.client import ApiError, Client
from tensorant_cli.commands.common import run_id_of
from tensorant_cli.output import items, say
from tensorant_cli.render import (
    attempt_line,
    cli_words,
    clock,
    duration,
    event_text,
    money,
    next_steps,
    preference_line,
    printable,
    reason_lines,
    status_block,
)

# Where `runs watch` stops: terminal states, and `retained` (the run waits for a person).
STOP_STATES = {"succeeded", "failed", "cancelled", "retained"}


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
        lines = [x if isinstance(x, str) else json.dumps(x, default=str) for x in items(data, "lines")]
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


def _preference(client: Client, run: dict[str, Any]) -> str | None:
    """A DPO run's last held-out preference accuracy and reward margin (its eval curve), once it has stopped;
    None for any other run (its metrics are not read: a rate-limited read)."""
    if (run.get("training") or {}).get("method") != "dpo":
        return None
    try:
        return preference_line(client.get(f"/api/runs/{run.get('id')}/metrics"))
    except ApiError:
        return None  # the curve is a nicety here: the run's end is still said


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
    seen_attempts: set[int] = set()
    said_reason = ""  # the last transition's reason: a run keeps it through releasing -> failed
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
        # A line per launch attempt (a candidate refused for capacity, quota or stock, the one that launched).
        for attempt in run.get("attempts") or []:
            if isinstance(attempt, dict) and int(attempt.get("index", -1)) not in seen_attempts:
                seen_attempts.add(int(attempt.get("index", -1)))
                lines.append(f"{clock(attempt.get('ended_at'))}  {attempt_line(attempt)}")
        for e in run.get("events") or []:
            key = (str(e.get("at")), str(e.get("message")))
            if (e.get("data") or {}).get("type") == "run.attempt_refused":
                continue  # said by its attempt's line
            if e.get("kind") in ("transition", "warning") and key not in seen_events:
                seen_events.add(key)
                mark = "" if e.get("kind") == "transition" else "warning: "
                message, said_reason = event_text(e, said_reason)
                lines.append(f"{clock(e.get('at'))}  {mark}{cli_words(message, run_id)}")
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
            if (preference := _preference(client, run)) is not None:
                out.write(printable(preference) + "\n")
            for line in next_steps(run):
                out.write(printable(line) + "\n")
            outcome = run.get("outcome")
            cost = run.get("final_cost") if run.get("final_cost") is not None else run.get("cost_so_far")
            # Both times: a retained run's clock goes on while its GPU no longer bills.
            kept = " with a checkpoint's adapter, not a completed one" if run.get("adapter_kind") == "checkpoint" else ""
            out.write(printable(f"run {run_id} {state}" + (f" (outcome: {outcome})" if outcome and outcome != state else "")
                                + kept + f" after {duration(run.get('elapsed_s'))} (billed GPU "
                                + f"{duration(run.get('billed_machine_s'))}), cost {money(cost)}") + "\n")
            out.flush()
            return 0 if state == "succeeded" else 1
        polls += 1
        if max_polls is not None and polls >= max_polls:
            return 1
        time.sleep(interval)


def logs(args: argparse.Namespace, client: Client) -> int:
    """`runs logs`: the lines logged so far; with --follow, new ones until the run ends, then how it ended."""
    run_id = run_id_of(args, client)
    cursor = _LogCursor(client, run_id)
    while True:
        for line in cursor.new_lines():
            say(line)
        if not args.follow:
            return 0
        run = client.get(f"/api/runs/{run_id}")
        state = str(run.get("state"))
        if state in STOP_STATES:
            for line in cursor.new_lines():
                say(line)
            # The end of a followed log says how the run ended (it may have ended long ago): the reason's
            # first line only, its trainer's last lines were just printed as the log.
            head = (reason_lines(run.get("reason")) or [""])[0]
            say(f"run {run_id} {state}" + (f": {head}" if head else ""))
            return 0 if state == "succeeded" else 1
        sys.stdout.flush()
        time.sleep(args.interval)
