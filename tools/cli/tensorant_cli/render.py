"""How runs read on a terminal: durations, money, progress, the loss sparkline, the status block."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

SPARKS = "▁▂▃▄▅▆▇█"

# C0 controls but tab, DEL, and the C1 controls (U+0080-U+009F; U+009B alone starts a CSI sequence
# on many terminals), each shown as \xNN. Other Unicode text is kept as it is.
_CONTROLS: dict[int, str] = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c != 0x09}
# Invisible format characters, each shown as \uNNNN: bidi embeddings, overrides and isolates (U+202E turns
# "gpj.exe" around on the screen, a fake reason can hide its real text), zero-width spaces and joiners, the
# word joiner and invisible operators, the BOM, the line and paragraph separators (a line break in some
# terminals). The CLI prints what a run wrote: what it shows must be what is there.
_INVISIBLE = (0x00AD, 0x061C, 0x180E, *range(0x200B, 0x2010), 0x2028, 0x2029, *range(0x202A, 0x202F),
              *range(0x2060, 0x2065), *range(0x2066, 0x206A), 0xFEFF)
_CONTROLS.update({c: f"\\u{c:04x}" for c in _INVISIBLE})


def printable(text: Any) -> str:
    """Text that came from a run or the API (log lines, reasons, events), safe to print: an escape
    sequence in it could otherwise retitle or clear the user's terminal, move the cursor, or
    overwrite a line (\\r) with a fake "succeeded", and a bidi override or a zero-width character could
    make it read as something else. Idempotent: the result has no control characters left."""
    return str(text).translate(_CONTROLS)


def duration(seconds: Any) -> str:
    if seconds is None:
        return "-"
    s = round(float(seconds))
    if s < 60:
        return f"{float(seconds):.1f}s" if float(seconds) < 10 else f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def gpu_hours(hours: Any) -> str:
    """GPU hours, always with three decimals (3.6 s): every row and every command rounds alike."""
    return "-" if hours is None else f"{float(hours):.3f}"


def money(value: Any, currency: str = "USD") -> str:
    if value is None:
        return "-"
    v = float(value)
    sign = "$" if currency == "USD" else ""
    tail = "" if sign else f" {currency}"
    return f"{sign}{v:.4f}{tail}" if v < 1 else f"{sign}{v:.2f}{tail}"


def approx(seconds: Any) -> str:
    """A predicted duration as a person reads it: '40 s', '12 min', '2.5 h'."""
    s = float(seconds)
    if s < 60:
        return f"{max(1, round(s))} s"
    if s < 2 * 3600:
        return f"{round(s / 60)} min"
    return f"{s / 3600:.1f} h"


def forecast_line(run: dict[str, Any]) -> str | None:
    """The run's forecast in one line, or None for a run made before forecasts:
    'forecast: ~12 min training + 4 min start, ~$0.35 (tokens estimated from bytes)'."""
    f = run.get("forecast")
    if not isinstance(f, dict):
        return None
    currency = str((run.get("offer") or {}).get("currency") or "USD")
    cost = float(f.get("cost") or 0.0)
    money_text = f"${cost:.2f}" if currency == "USD" else f"{cost:.2f} {currency}"
    uncertain = f"; {f['uncertainty']}" if f.get("uncertainty") else ""
    return printable(f"forecast: ~{approx(f.get('training_s') or 0)} training + {approx(f.get('startup_s') or 0)} "
                     f"start, ~{money_text} (tokens {f.get('tokens_source') or 'estimated'}){uncertain}")


def forecast_check_line(run: dict[str, Any]) -> str | None:
    """How far the forecast was from what the trainer measured, once the adapter is verified:
    'measured: 9.5 min training (forecast 26% long), 412,000 tokens (forecast 3% short)'."""
    c = run.get("forecast_check")
    if not isinstance(c, dict):
        return None

    def off(error: Any) -> str:
        e = float(error or 0.0)
        return f"{abs(e):.0%} {'long' if e >= 0 else 'short'}"

    return printable(f"measured: {approx(c.get('training_s') or 0)} training (forecast {off(c.get('training_error'))}), "
                     f"{int(c.get('tokens') or 0):,} tokens (forecast {off(c.get('tokens_error'))})")


def percent(progress: Any) -> str:
    p = min(max(float(progress or 0.0), 0.0), 1.0)
    return f"{p * 100:.0f}%"


def progress_bar(progress: float, width: int = 30) -> str:
    p = min(max(progress or 0.0, 0.0), 1.0)
    filled = round(p * width)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {p * 100:5.1f}%"


def sparkline(values: list[float], width: int = 40) -> str:
    """A one-line chart of the values (downsampled to `width` by averaging buckets)."""
    if not values:
        return ""
    if len(values) > width:
        size = len(values) / width
        values = [sum(chunk) / len(chunk) for i in range(width)
                  if (chunk := values[int(i * size):max(int((i + 1) * size), int(i * size) + 1)])]
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - lo) / span * (len(SPARKS) - 1) + 0.5))] for v in values)



def preference_line(metrics: Any) -> str | None:
    """A DPO run's held-out preference accuracy per evaluation (GET /metrics eval_points: a sparkline, first
    -> last) and its last reward margin; None for a run without them."""
    evals = metrics.get("eval_points") if isinstance(metrics, dict) else None
    prefs = [p for p in evals or [] if isinstance(p, dict) and isinstance(p.get("preference_accuracy"), int | float)]
    if not prefs:
        return None
    accuracy = [float(p["preference_accuracy"]) for p in prefs]
    margin = prefs[-1].get("reward_margin")
    return (f"preference accuracy {sparkline(accuracy)}  {accuracy[0]:.0%} -> {accuracy[-1]:.0%} at step "
            f"{prefs[-1].get('step')}, reward margin {float(margin) if isinstance(margin, int | float) else 0:.4g}")

def clock(at: Any) -> str:
    """An event time as HH:MM:SS (local time), or the text as it came."""
    try:
        return datetime.fromisoformat(str(at).replace("Z", "+00:00")).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return str(at)


# The API's hints name its JSON fields and HTTP methods; the CLI's user types flags. Phrases first
# (in order), then single fields as whole words, so that max_price_limit_per_hour (another field) stays.
# `{run}` is the run the command was about.
_API_PHRASES = (
    ("raise price_limit_per_hour (PATCH the draft)", "raise the limit (`tensorant runs edit {run} --price-limit N`)"),
    ("until price_limit_per_hour is raised", "until the limit is raised (`tensorant runs edit {run} --price-limit N`)"),
    ("send discard: true", "cancel again with --discard"),
    ("discard: true", "--discard"),
    ("discard: false", "--keep"),
    ("resume training from it (recover mode resume)", "resume training from it (`tensorant runs recover {run} --resume`)"),
    ("recover again with accept_checkpoint: true", "recover again with --accept-checkpoint"),
)
API_FLAGS = {
    "price_limit_per_hour": "--price-limit",
    "runtime_limit_s": "--runtime-limit",
    "dataset_version_id": "--dataset",
    "offer_id": "--offer",
    "base_model_revision": "--base-model-revision",
    "base_model": "--base-model",
    "discard": "--discard or --keep",
}
_API_FIELD = re.compile(r"\b(" + "|".join(name for name in API_FLAGS if name != "discard") + r")\b")


def cli_words(text: str, run_id: str = "<RUN_ID>") -> str:
    """An API message in the CLI's words: `tensorant runs edit ... --price-limit N`, not "PATCH the draft"."""
    for api, cli in _API_PHRASES:
        text = text.replace(api, cli.format(run=run_id))
    return _API_FIELD.sub(lambda m: API_FLAGS[m.group(1)], text)


def cli_field(field: str) -> str:
    """A field error's field as the flag that sets it (training.lora_r -> --set-training lora_r)."""
    if field.startswith("training."):
        return f"--set-training {field.removeprefix('training.')}"
    return API_FLAGS.get(field, field)


def adapter_line(run: dict[str, Any]) -> str | None:
    """What the run's verified adapter is, when it is a checkpoint's (an incomplete training the owner
    accepted at a recovery): 'adapter: the checkpoint at step 20 of 100,000 (0.02% of the planned steps) ...'.
    None for a final adapter or none yet."""
    if run.get("adapter_kind") != "checkpoint":
        return None
    step, planned = run.get("checkpoint_step"), run.get("planned_steps")
    if isinstance(step, int) and isinstance(planned, int) and planned > 0:
        where = f"step {step:,} of {planned:,} ({100 * step / planned:.3g}% of the planned steps)"
    else:
        where = f"step {step}"
    return printable(f"adapter: the checkpoint at {where}, accepted at recovery: training stopped before its end, "
                     "this is not a completed adapter")


def merged_line(run: dict[str, Any]) -> str | None:
    """training.merged, once the run has an adapter: the merged model's download, or why there is none."""
    if not (run.get("training") or {}).get("merged") or run.get("state") != "succeeded":
        return None
    if run.get("merged_sha256"):
        size = int(run.get("merged_size") or 0)
        return printable(f"merged model: verified ({size / 1e6:,.0f} MB): tensorant runs download {run.get('id')} "
                         "--merged")
    return printable(str(run.get("merged_note") or "no merged model"))


def status_line(run: dict[str, Any]) -> str:
    """One line: id, state, phase, progress, reason (the short form, for cancel/release/recover)."""
    parts = [f"{run.get('id', '?')}", f"state={run.get('state', '?')}"]
    if run.get("phase"):
        parts.append(f"phase={run['phase']}")
    parts.append(progress_bar(float(run.get("progress") or 0.0)))
    if run.get("adapter_kind") == "checkpoint":
        parts.append(f"adapter=checkpoint@{run.get('checkpoint_step')}/{run.get('planned_steps')}")
    if run.get("reason"):
        parts.append("reason: " + " / ".join(reason_lines(run["reason"])))
    return printable("  ".join(parts))


def event_text(event: dict[str, Any], said_reason: str) -> tuple[str, str]:
    """An event's message as the history prints it, and the reason said so far. A transition ("a -> b:
    <reason>") keeps its reason's first line, and none when the previous transition said the same (a run
    keeps its reason through releasing -> failed): a failure's reason, with the trainer's last lines, was
    printed three times as \x0a's. The status block says all of it once."""
    message = str(event.get("message"))
    if event.get("kind") != "transition":
        return message, said_reason
    move, _, why = message.partition(": ")
    if not why or why == said_reason:
        return move, said_reason
    return f"{move}: {(reason_lines(why) or [''])[0]}", why


def reason_lines(reason: Any) -> list[str]:
    """A run's reason as the lines it holds (a failure's reason ends with the trainer's last lines), each
    printable: a line break shown as \x0a made a 1,500-character reason unreadable."""
    return [printable(line) for line in str(reason).splitlines() if line.strip()]


def status_block(run: dict[str, Any]) -> list[str]:
    """The live block of `runs watch`: where the run is, what it has cost, where it runs."""
    offer = run.get("offer") or {}
    currency = str(offer.get("currency") or "USD")
    state = str(run.get("state", "?"))
    phase = run.get("phase") or ""
    head = f"run {run.get('id', '?')}  {state}" + (f" ({phase})" if phase and phase != state else "")
    head += "  " + progress_bar(float(run.get("progress") or 0.0), width=24)
    final = run.get("final_cost") is not None
    cost = run.get("final_cost") if final else run.get("cost_so_far")
    rate = offer.get("total_per_hour")
    lines = [
        head,
        # Both times, labelled: a retained run's clock goes on while its GPU no longer bills.
        f"  elapsed {duration(run.get('elapsed_s'))}, billed GPU {duration(run.get('billed_machine_s'))}   "
        f"{'final cost' if final else 'cost so far'} {money(cost, currency)}"
        + (f" (at {money(rate, currency)}/h)" if rate is not None else ""),
        f"  provider {run.get('provider', '?')}   machine {offer.get('machine_type', '?')} "
        f"({offer.get('gpu', '?')})   region {offer.get('region') or '-'}",
    ]
    if (adapter := adapter_line(run)) is not None:
        lines.append(f"  {adapter}")
    if (merged := merged_line(run)) is not None:
        lines.append(f"  {merged}")
    if run.get("reason"):
        first, *rest = reason_lines(run["reason"]) or [""]
        lines += [f"  reason: {first}", *(f"    {line}" for line in rest)]
    return [printable(line) for line in lines]


def next_steps(run: dict[str, Any]) -> list[str]:
    """What a person can do with a run that waits for one (retained), each with its command; [] otherwise."""
    if run.get("state") != "retained":
        return []
    rid = str(run.get("id"))
    if run.get("adapter_saved") is False:
        # No checkpoint or adapter reached storage (stopped before its first checkpoint): --verify-saved and
        # --resume would only fail, and there is no archive to --upload.
        return [
            "nothing of this run's training was saved (it stopped before its first checkpoint): there is nothing "
            "to verify or resume from. What works (the disk bills until the run ends):",
            f"  tensorant runs cancel {rid} --discard              release the machine and disk",
            f"  tensorant runs recover {rid} --start-machine       start the machine to look at its disk (GPU "
            "billing resumes)",
        ]
    return [
        "what to do next (the machine is stopped and its disk kept: the disk bills until the run ends):",
        f"  tensorant runs recover {rid} --verify-saved        verify the adapter in storage (the final one, else "
        "the last checkpoint's, taken only with --accept-checkpoint); good: succeeded and released",
        f"  tensorant runs recover {rid} --upload adapter.zip  verify an archive you fetched from the machine",
        f"  tensorant runs recover {rid} --resume              train on from the last checkpoint (the machine is "
        "started again)",
        f"  tensorant runs cancel {rid} --discard              release the machine and disk, deleting any output",
    ]


def candidate_text(c: dict[str, Any]) -> str:
    """One candidate (or the one that ran): connection, offer, GPU and price."""
    return f"{c.get('connection')} {c.get('offer_id')} ({c.get('gpu')}, {money(c.get('total_per_hour'))}/h)"


def candidate_lines(run: dict[str, Any]) -> list[str]:
    """A run's candidates in order, and the one its machine runs on (`runs get`, the launch confirmation)."""
    listed = [c for c in run.get("candidates") or [] if isinstance(c, dict)]
    if len(listed) < 2 and not run.get("attempts"):
        return []
    out = [f"candidate {i + 1}: {candidate_text(c)}" for i, c in enumerate(listed)] if len(listed) > 1 else []
    if isinstance(run.get("ran_on"), dict):
        out.append(f"ran on: {candidate_text(run['ran_on'])}")
    return out


def attempt_line(a: dict[str, Any]) -> str:
    """One launch attempt: which candidate, how it ended, the cloud's code and words, the seconds it took."""
    code = f" {a.get('code')}" if a.get("code") else ""
    message = f": {a.get('message')}" if a.get("message") and a.get("outcome") != "launched" else ""
    return (f"attempt {int(a.get('index', 0)) + 1}: {a.get('connection')} {a.get('offer_id')} ({a.get('gpu')}, "
            f"{money(a.get('price_per_hour'))}/h) {a.get('outcome')}{code} after {duration(a.get('seconds'))}"
            f"{message}")
