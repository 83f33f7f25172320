"""What the agent on the machine reports: heartbeats (phase, progress, logs) and completion.

Agent tokens are short-lived (settings.agent_token_ttl_s) and renewed through heartbeat
replies while the run is active; a run that has ended refuses its agent's calls whatever
the token's expiry, so a leaked token is worth nothing after the run. A failed completion retains the machine only where it may
hold recoverable output; otherwise the run is released and failed (keeping a disk with nothing on it would only bill).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shared.clock import now, now_ts
from shared.context import Context
from shared.errors import ConcurrencyError, Conflict, InvalidInput, Unauthorized
from shared.key_rotation import current_key_since, renewable
from shared.lifecycle import ACTIVE, PHASE_ORDER, TERMINAL, transition, walk
from shared.models import AgentComplete, Heartbeat, Outcome, RunRecord, RunState, StepMessage
from shared.runs.events import event
from shared.runs.forecast import apart, minutes
from shared.runs.moves import decide_stored, move_stored
from shared.security import ORG_RE, AgentToken, mint_agent_token, signed_agent_claims, verify_agent
from shared.steps import serving

# A refused token is noted on the run at most this often: the note is written for a caller whose
# token did not verify, so it must not become a way to make writes.
REFUSAL_NOTE_EVERY_S = 300


def verify(ctx: Context, header: str | None, run_id: str) -> AgentToken:
    """The run's agent token, verified; a refusal is noted on the run the token names (see below)."""
    try:
        return verify_agent(ctx, header, run_id)
    except Unauthorized as exc:
        _note_refused(ctx, header, run_id, exc.detail)
        raise


def _note_refused(ctx: Context, header: str | None, run_id: str, why: str) -> None:
    """An agent whose calls are refused (an expired token, one signed with the previous key after
    TENSORANT_JWT_SECRET_PREVIOUS was dropped too early) looks like a silent one: note why on its run,
    so the deadline's reason can say it. Only for a token whose signature verifies (anyone can write
    an unsigned one naming any org's run), only on the run it names and the URL's, an active run,
    once per interval."""
    claims = signed_agent_claims(header)
    if claims is None:
        return
    org = claims.get("org")
    if claims.get("run") != run_id or not isinstance(org, str) or not ORG_RE.fullmatch(org):
        return
    try:
        run, _ = ctx.store.runs.get(org, run_id)
    except Exception:  # no such run: nothing to note
        return
    t = now()
    if run.state not in ACTIVE or (run.agent_refused_at and (t - run.agent_refused_at).total_seconds()
                                   < REFUSAL_NOTE_EVERY_S):
        return

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in ACTIVE or r.agent_refused_at != run.agent_refused_at:
            return None
        return r.model_copy(update={"agent_refused": why[:300], "agent_refused_at": t})

    try:
        ctx.store.runs.mutate(org, run_id, change)
    except Exception:  # a note, never a reason to answer other than 401
        return


def refuse_ended(run: RunRecord) -> None:
    """An ended run's agent token no longer authenticates, whatever its expiry."""
    if run.state in TERMINAL:
        raise Unauthorized(f"the run is {run.state.value}: its agent token is no longer accepted")


# Agent logs are bounded at every step, so an agent cannot fill the tables: a line, a heartbeat, a stored chunk, a run.
MAX_LINE_CHARS = 2000
TRUNCATED_MARK = " [truncated]"
# Far below the table's 1 MiB entity limit, and the few chunks it makes are cheap to write.
MAX_HEARTBEAT_LOG_BYTES = 256 * 1024
MAX_RUN_LOG_LINES = 20_000
LOG_LIMIT_LINE = f"[tensorant] this run reached {MAX_RUN_LOG_LINES} log lines; further lines are dropped"
# Heartbeats of one run racing each other (or a step) retry this often before answering 409.
HEARTBEAT_ATTEMPTS = 16


# The control plane's own lines in a run's log begin with CONTROL_MARK; a machine's line (the agent's or
# the trainer's: both run on a machine the org's code controls) that would too is stored with
# MACHINE_MARK first, so in the log, the console and the CLI alike no machine text passes for the
# control plane's words (`[tensorant] warning: ... https://evil.example`).
CONTROL_MARK = "[tensorant]"
MACHINE_MARK = "[machine] "
# What a reader's eye skips before the first visible character: spaces, controls, zero-width and
# bidirectional marks (Unicode categories Z*, Cc and Cf).
_INVISIBLE_CATEGORIES = ("Zs", "Zl", "Zp", "Cc", "Cf")


def _looks_like_control(line: str) -> bool:
    import unicodedata

    shown = unicodedata.normalize("NFKC", line)  # fullwidth ［ｔｅｎｓｏｒａｎｔ］ reads the same
    start = 0
    while start < len(shown) and unicodedata.category(shown[start]) in _INVISIBLE_CATEGORIES:
        start += 1
    head = "".join(c for c in shown[start:start + 64] if unicodedata.category(c) != "Cf")
    return head.casefold().startswith(CONTROL_MARK[:-1].casefold())


def _machine_line(line: str) -> str:
    line = MACHINE_MARK + line if _looks_like_control(line) else line
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + TRUNCATED_MARK


@dataclass
class _Told:
    """What a heartbeat's write decided besides the run: the log lines it stores (numbered from `start`, the
    run's count as that write read it), whether it reached the run's line cap, the pace warning it gave."""
    start: int
    lines: list[str] = field(default_factory=list)
    warn: bool = False
    pace: str = ""


def heartbeat(ctx: Context, org: str, run_id: str, hb: Heartbeat, *, token: AgentToken | None = None) -> dict[str, Any]:
    """One ETag-guarded write of the run (after a read only when this process has no current
    copy of it), plus one write per log chunk (and an event only when the state moves or the
    run's log limit is first reached).

    `token`: the token the agent sent; a fresh one for the same org and run is handed out in the reply
    while the run is active and less than half of a token's lifetime is left, or at once when it was
    signed with the previous, rotated-out key, but only if it was issued before the rotation
    (shared/key_rotation.py: a token forged with the rotated-out key must not be laundered)."""
    store = ctx.store
    t = now()
    lines = [_machine_line(line) for line in hb.logs]
    size = sum(len(line.encode()) for line in lines)
    if size > MAX_HEARTBEAT_LOG_BYTES:
        # Refused before any write, as a 4xx: the agent drops the batch instead of resending it.
        raise InvalidInput.field("logs", f"{size} bytes of log lines in one heartbeat; at most "
                                 f"{MAX_HEARTBEAT_LOG_BYTES} are accepted: send them in smaller batches")
    target = RunState(hb.phase)

    def change(r: RunRecord) -> tuple[RunRecord | None, _Told]:
        if r.state not in ACTIVE:
            return None, _Told(r.log_lines)
        # Lines past the run's cap are dropped; the first time, one marker line says so.
        keep = lines[:max(0, MAX_RUN_LOG_LINES - r.log_lines)]
        told = _Told(r.log_lines)
        if len(keep) < len(lines) and r.log_lines + len(keep) == MAX_RUN_LOG_LINES:
            keep = [*keep, LOG_LIMIT_LINE]
            told.warn = True
        if PHASE_ORDER.index(target) > PHASE_ORDER.index(r.state):
            r = walk(r, target)
        if r.state == RunState.training and hb.progress > 0 and (
                r.pace_from is None or r.pace_from < r.state_changed_at):
            # The first step of this training period (a resume starts a new one): the pace is measured from here.
            r = r.model_copy(update={"pace_from": t, "pace_from_progress": hb.progress})
        pace = "" if r.pace_warned else pace_warning(r, hb.progress, t)
        if pace:
            told.pace = pace
            keep = [*keep, f"[tensorant] warning: {pace}"]
        told.lines = keep
        if hb.checkpoints:
            # The agent's whole current list; a slot past the run's keep_checkpoints is not the run's.
            kept = [c for c in hb.checkpoints if c.slot < r.training.keep_checkpoints]
            r = r.model_copy(update={"checkpoints": sorted(kept, key=lambda c: c.step)})
        return r.model_copy(update={
            "pace_warned": r.pace_warned or bool(pace),
            "phase": hb.phase, "progress": max(hb.progress, r.progress if r.state == target else 0.0),
            "last_heartbeat_at": t, "updated_at": t, "log_lines": r.log_lines + len(keep),
            "deadlines": r.deadlines.model_copy(
                update={"heartbeat_by": t + timedelta(seconds=ctx.settings.heartbeat_timeout_s)}),
        }), told

    try:
        run, wrote, told = decide_stored(ctx, org, run_id, change, attempts=HEARTBEAT_ATTEMPTS, from_last_write=True)
    except ConcurrencyError as exc:
        # Nothing was written: the agent sends its state again with the next heartbeat.
        raise Conflict("the run changed at the same time as this heartbeat; send it again") from exc
    if wrote and told.lines:
        # Numbered from the run's count at the write that won: concurrent heartbeats never share numbers.
        store.logs.add(run_id, told.start, told.lines)
    if wrote and told.warn:
        event(ctx, run, "warning", f"the run reached {MAX_RUN_LOG_LINES} log lines; further lines are dropped "
              "(the full log is uploaded with the adapter)")
    if wrote and told.pace:
        event(ctx, run, "warning", told.pace, type="run.pace_warning")
    if not wrote:
        refuse_ended(run)
    reply: dict[str, Any] = {"state": run.state.value, "stop": run.state not in ACTIVE,
                             # A run gets back to training from retained only through `recover --resume`:
                             # an agent that stopped its trainer runs it again from its last checkpoint.
                             "resume": run.state == RunState.training}
    if run.state in ACTIVE:
        # The current key's first sight is recorded by the first heartbeat after a rotation (once per
        # process), so a token forged with the rotated-out key later is not renewed below.
        current_key_since(ctx)
    ttl = ctx.settings.agent_token_ttl_s
    if run.state in ACTIVE and token is not None and (token.previous_key or token.expires_at - now_ts() < ttl / 2) \
            and renewable(ctx, token.issued_at, token.previous_key, run.launched_at):
        # The token's own org and run (verify_agent checked the run is the URL's): never a wider scope.
        reply["token"] = mint_agent_token(token.org, run_id, ttl_s=ttl)
        reply["token_expires_at"] = (t + timedelta(seconds=ttl)).isoformat()
    return reply


# What failed, when the agent says (older agents do not): the run's reason starts with it.
_STAGE_HEADS = {
    "dataset": "the dataset download failed",
    "export": "writing adapter.zip failed",
    "upload": "the adapter upload failed",
}


# The pace is judged once this much of the training is done since its first step: a few steps' time is noise.
PACE_MIN_PROGRESS = 0.1


def pace_warning(run: RunRecord, progress: float, t: datetime) -> str:
    """What to say when, at the trainer's pace so far, the planned steps would end after the runtime
    limit: the run would be retained at the limit with its output kept, instead of succeeding. The pace is
    counted from the first step (run.pace_from), never from the move to training: loading the model (a
    GGUF conversion takes minutes on a CPU) happens once, before it, and is not what the remaining steps take."""
    limit_at = run.deadlines.runtime_by
    since = run.pace_from
    if run.state != RunState.training or since is None or since < run.state_changed_at or progress >= 1.0 \
            or limit_at is None:
        return ""
    done = progress - run.pace_from_progress
    elapsed = (t - since).total_seconds()
    if done < PACE_MIN_PROGRESS or elapsed <= 0:
        return ""
    remaining = elapsed * (1 - progress) / done
    if t + timedelta(seconds=remaining) <= limit_at:
        return ""

    # Said in seconds under a minute ("in 0 min ... ends in 0 min" read as nothing), and to the second
    # when the need and what is left would read alike.
    need, left = apart(remaining, max(1.0, (limit_at - t).total_seconds()))
    return (f"at the trainer's pace since its first step ({done:.0%} of the planned steps in {minutes(elapsed)}) "
            f"the training needs about {need} more, but the runtime limit ends in {left}: the run will then be "
            "retained with its output kept, not succeed. Next time give it a longer limit (--runtime-limit) or fewer "
            "steps (--set-training max_steps=N)")


def _failure_reason(body: AgentComplete) -> str:
    if body.stage in _STAGE_HEADS:
        return f"{_STAGE_HEADS[body.stage]}: {body.reason or 'no reason given'}"
    if body.exit_code == 0:
        # Not "training failed (exit code 0)": the trainer said it succeeded but left no adapter.
        head = "the trainer exited with code 0 but wrote no adapter"
    else:
        head = "training failed" + (f" (exit code {body.exit_code})" if body.exit_code is not None else "")
    return f"{head}: {body.reason or 'no reason given'}"


def _last_lines(body: AgentComplete) -> str:
    # Not the line the reason already quotes ("last output: ..."): said once.
    lines = [line for line in body.last_lines if line.strip() and line.strip()[:300] not in body.reason][-10:]
    return ("; the trainer's last lines:\n" + "\n".join(lines)) if lines else ""


def complete(ctx: Context, org: str, run_id: str, body: AgentComplete) -> dict[str, Any]:
    store = ctx.store
    run, _ = store.runs.get(org, run_id)
    refuse_ended(run)
    before = run.state
    if body.status == "ok" and not body.sha256:
        raise InvalidInput.field("sha256", "a successful completion reports the adapter archive's sha256")

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in ACTIVE:
            return None
        if body.status == "ok":
            r = walk(r, RunState.verifying)
            return r.model_copy(update={"adapter_sha256": body.sha256, "adapter_size": body.size, "progress": 1.0,
                                        "merged_sha256": body.merged_sha256, "merged_size": body.merged_size})
        if body.output_exists is False:
            # Nothing on the machine to recover: keeping its disk would only bill.
            return transition(r, RunState.releasing, outcome=Outcome.failed, reason=(
                _failure_reason(body) + "; the trainer left no output to recover, so the machine and disk are "
                "released" + _last_lines(body))[:4000])
        return transition(r, RunState.retaining, reason=_failure_reason(body) + "; the machine is stopped and its "
                          "disk kept so output can be recovered" + _last_lines(body)[:2000])

    run, wrote = move_stored(ctx, org, run_id, change)
    repeated = run.state in (RunState.verifying, RunState.retaining) or (
        run.state == RunState.releasing and run.outcome == Outcome.failed and body.status == "failed")
    if not wrote and not repeated and before not in ACTIVE:
        raise Conflict(f"the run is {run.state.value}; it no longer takes a completion")
    # The step that takes the run where the completion left it (verifying, retaining or releasing);
    # re-sent on a repeated completion too (the step ignores a run that has moved on), except to a
    # run verifying: each message there is a full verification of the archive (30 s and more for a
    # large one), so one adapter digest is verified once; a message lost between the write and the
    # send is re-sent by heartbeat-check (RESEND_AFTER_S).
    step = serving(run.state)
    if step is not None and (wrote or (repeated and run.state != RunState.verifying)):
        ctx.queues.send(step, StepMessage(org=org, run_id=run_id))
    return {"state": run.state.value}
