"""The verify-adapter step: check the adapter archive the agent uploaded, then release or retain.

It serves a run in verifying (the agent reported completion) or recovering (an owner asked
to recover a retained run). A good archive ends the run succeeded through releasing; a bad
one retains the machine and disk (verifying) or leaves the run retained (recovering), with
the problems as the reason. With training.merged, the merged model (runs/<id>/merged.zip) is verified
next, as strictly (adapter_format.merged); refused or missing, the run still succeeds with its adapter, and
merged_note says why there is no merged model. A checkpoint's adapter (its manifest's checkpoint_step) is an
incomplete training: it ends a run only at a recovery whose owner accepted it
(accept_checkpoint), marked adapter_kind "checkpoint" with its step; otherwise it is refused
like a bad archive, saying to resume or to accept it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeVar

from shared.context import Context
from shared.log import redact_text
from shared.models import ForecastCheck, Outcome, RunRecord, RunState, StepMessage, VerifyProgress
from shared.org_storage.base import ObjectMissing, adapter_key, merged_key
from shared.providers.registry import smoke_trainer_providers
from shared.runs import forecast
from shared.runs.events import event
from shared.runs.hub_models import kept
from shared.runs.moves import move
from shared.runs.org_backends import storage_for
from shared.services.steps import verify_spool
from shared.steps import Step

Judged = TypeVar("Judged")
MAX_ADAPTER_BYTES = 1024 * 1024 * 1024
# The archive is copied from storage to a spool file in chunks, never held whole (shared/services/steps/
# verify_spool.py, which also bounds the copy in time): with the verifier's own bound
# (adapter_format/verify.MEMORY_BOUND_BYTES) a verification holds a few MiB whatever the adapter's size, so six
# at once fit an instance (issue 30: 4096 MB on Flex).


def unreadable_is_refused(verify: Callable[[], Judged]) -> Judged:
    """The verifier's judgement of an archive already in a local file. The archive is untrusted: an error the
    verifier did not foresee (zipfile's NotImplementedError for a newer zip version was one) refuses it as
    unreadable, as ValueError, instead of failing the step until its message is set aside as poison."""
    try:
        return verify()
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"the archive could not be read by the verifier ({type(exc).__name__}: "
                         f"{redact_text(str(exc))[:200]})") from exc


def verify_adapter(ctx: Context, msg: StepMessage) -> None:
    run, _ = ctx.store.runs.get(msg.org, msg.run_id)
    if run.state not in Step.verify_adapter.serves:
        return
    with verify_spool.locked(run.id) as held:
        if not held:
            return  # another invocation on this instance is downloading; it sends the next message itself
        run, _ = ctx.store.runs.get(msg.org, msg.run_id)  # as it is now that this invocation holds the spools
        if run.state not in Step.verify_adapter.serves:
            return
        fetched = fetch_archives(ctx, run)
        if fetched is None:
            return  # the download carries on in the next invocation
        judge(ctx, run, fetched)
    verify_spool.discard(run.id)


def fetch_archives(ctx: Context, run: RunRecord) -> dict[str, verify_spool.Spooled | str] | None:
    """The run's archives (the adapter; the merged model when one was reported), each whole in a local spool
    or the problem that refuses it; None when the step's budget cut a download: its progress is recorded on
    the run and the step sends itself the next message (verify_spool says where the bytes are kept)."""
    # lazy: adapter_format.verify loads numpy (about 0.1 s more on every cold start)
    from adapter_format.merged import MAX_MERGED_BYTES

    progress = run.verify_progress
    ours = progress is not None and progress.token and progress.since == run.state_changed_at
    token = progress.token if progress is not None and ours else uuid.uuid4().hex[:16]
    folder = verify_spool.spool_dir(run.id) / token
    folder.mkdir(parents=True, exist_ok=True)
    wanted: list[tuple[Literal["adapter", "merged"], str, int, str]] = [
        ("adapter", adapter_key(run.id), MAX_ADAPTER_BYTES, "the adapter archive")]
    if run.training.merged and run.merged_sha256:
        wanted.append(("merged", merged_key(run.id), MAX_MERGED_BYTES, "the merged model's archive"))
    storage = storage_for(ctx, run.org)
    fetched: dict[str, verify_spool.Spooled | str] = {}
    for name, key, cap, what in wanted:
        if name == "merged" and isinstance(fetched["adapter"], str):
            break  # a refused adapter ends the verification: its merged model is not judged
        try:
            got = verify_spool.fetch(storage, key, folder / f"{name}.part", cap, what)
        except ObjectMissing:
            fetched[name] = f"no {name} archive at {key} in storage"
            continue
        except ValueError as exc:
            fetched[name] = str(exc)
            continue
        if isinstance(got, verify_spool.Partial):
            carry_on(ctx, run, VerifyProgress(artifact=name, offset=got.offset, size=got.size, host=verify_spool.host(),
                                              token=token, since=run.state_changed_at))
            return None
        fetched[name] = got
    return fetched


def carry_on(ctx: Context, run: RunRecord, progress: VerifyProgress) -> None:
    """Record how far the download got, then send the step its next message: recorded first, so a process
    that dies between the two leaves the message it was serving to be delivered again, which carries on from
    the spool. Only a run whose progress is still what this invocation read is written: a second delivery of
    one message that went on meanwhile on another instance (its own spool) wrote it, and sends the next."""
    seen = run.verify_progress

    def change(r: RunRecord) -> RunRecord | None:
        if r.state not in Step.verify_adapter.serves or r.verify_progress != seen:
            return None
        return r.model_copy(update={"verify_progress": progress})

    stored, wrote = ctx.store.runs.mutate(run.org, run.id, change)
    if wrote and (seen is None or seen.artifact != progress.artifact or seen.token != progress.token):
        # Once per archive: the run stays verifying for minutes, and its timeline says why.
        what = "adapter archive" if progress.artifact == "adapter" else "merged model's archive"
        event(ctx, stored, "audit", f"the {what} ({progress.size / 1e9:.2f} GB) is downloaded over several "
              f"invocations, each within its time bound: {progress.offset / 1e9:.2f} GB so far",
              offset=progress.offset, size=progress.size)
    if wrote:
        ctx.queues.send(Step.verify_adapter, StepMessage(org=run.org, run_id=run.id,
                                                         reason="the archive's download carries on"))


def judge(ctx: Context, run: RunRecord, fetched: dict[str, verify_spool.Spooled | str]) -> None:
    """The verification of archives already spooled, and the run's move it decides."""
    problems, summary, sha256, size = check_adapter(ctx, run, fetched)
    step = summary.get("checkpoint_step") if not problems else None
    planned = summary.get("steps") if not problems else None
    if step is not None and not (run.state == RunState.recovering and run.accept_checkpoint):
        refuse_checkpoint(ctx, run, step, planned, sha256)
    elif not problems:
        succeed(ctx, run, fetched, summary, Found(step=step, planned=planned, sha256=sha256, size=size))
    else:
        why = "adapter verification failed: " + "; ".join(problems)
        if run.state == RunState.recovering:
            refuse_recovery(ctx, run, why + "; the machine and disk are still retained, so fix the archive and recover "
                            "again, or cancel with discard", sha256)
        else:
            retain(ctx, run, why)


def check_adapter(ctx: Context, run: RunRecord, fetched: dict[str, verify_spool.Spooled | str]
                  ) -> tuple[list[str], dict[str, object], str, int]:
    """The adapter archive's problems (none when it passes), the verifier's summary, and the digest and size
    of the bytes judged."""
    # lazy: adapter_format.verify loads numpy (about 0.1 s more on every cold start)
    from adapter_format.verify import verify_adapter as check_archive

    sha256, size = "", 0
    try:
        adapter = fetched["adapter"]
        if isinstance(adapter, str):
            raise ValueError(adapter)
        archive, sha256, size = verify_spool.open_spooled(adapter), adapter.sha256, adapter.size
        with archive:
            # Tests that play a cloud machine run the smoke trainer (TENSORANT_ALLOW_TEST_MODELS, test-only):
            # its adapter is accepted on any provider (None skips the provider's check).
            provider = None if ctx.settings.allow_test_models else run.provider
            hub_model = kept(ctx, run.org, run.base_model, run.base_model_revision)  # a Hub model's shapes, kept at create
            result = unreadable_is_refused(lambda: check_archive(
                archive, base_model=run.base_model, expected_sha256=run.adapter_sha256 or None, provider=provider,
                smoke_allowed_on=tuple(smoke_trainer_providers()), model=hub_model))
    except ValueError as exc:
        return [str(exc)], {}, sha256, size
    return list(result.problems), dict(result.summary), sha256, size


class Found(NamedTuple):
    """What the verification of a passing adapter archive found."""
    step: Any  # the checkpoint's step (None: the final adapter)
    planned: Any  # the trainer's planned steps, as its manifest says
    sha256: str
    size: int


def refuse_checkpoint(ctx: Context, run: RunRecord, step: object, planned: object, sha256: str) -> None:
    """The agent uploads each checkpoint's adapter as it is made, so a run stopped before its final adapter
    holds the last one: an incomplete training, not a completed adapter. It ends the run only when the
    owner said so at the recovery (accept_checkpoint); otherwise the run stays retained."""
    if run.finished_at_limit:
        # The trainer had reported every planned step: saying training stopped before them would be false.
        what_happened = (f"the archive is the checkpoint at step {step} of {planned}, not the final adapter: the "
                         "training finished all its planned steps, but its final adapter did not reach storage "
                         "before the machine was stopped")
    else:
        what_happened = (f"the archive is the checkpoint at step {step} of {planned} (training stopped before its "
                         "planned steps), not a completed adapter")
    refusal = (what_happened + "; resume training from it (recover mode resume), or accept it as "
               "the run's adapter (recover again with accept_checkpoint: true)")
    if run.state == RunState.recovering:
        refuse_recovery(ctx, run, refusal + "; the machine and disk are still retained", sha256)
    else:
        retain(ctx, run, refusal)


def retain(ctx: Context, run: RunRecord, reason: str) -> None:
    """A verifying run whose archive is refused keeps its machine and disk (the retain step)."""
    run, wrote = move(ctx, run, RunState.retaining, expect={RunState.verifying}, reason=reason, verify_progress=None)
    if wrote:
        ctx.queues.send(Step.retain, StepMessage(org=run.org, run_id=run.id))


def succeed(ctx: Context, run: RunRecord, fetched: dict[str, verify_spool.Spooled | str], summary: dict[str, object],
            found: Found) -> None:
    """The run succeeds with its adapter (a checkpoint here was accepted by the owner: the run's reason, view
    and events say which step it holds), and its machine is released."""
    what = success_reason(run, found.step, found.planned)
    recorded = success_fields(run, summary, found)
    checked = recorded.get("forecast_check")
    merged = run.training.merged and found.step is None
    if merged:
        recorded |= check_merged(ctx, run, fetched.get("merged"))
    run, wrote = move(ctx, run, RunState.releasing, expect={run.state}, reason=what, outcome=Outcome.succeeded,
                      **recorded)
    if not wrote:  # a second delivery verified the same archive at the same time: the first recorded it
        return
    event(ctx, run, "audit", what, sha256=run.adapter_sha256,
          **({"checkpoint_step": found.step} if found.step is not None else {}))
    if merged:
        event(ctx, run, "audit" if run.merged_sha256 else "warning", run.merged_note or "merged model verified",
              sha256=run.merged_sha256)
    if isinstance(checked, ForecastCheck):
        event(ctx, run, "audit", forecast.check_summary(checked), **checked.model_dump())
        forecast.record_measured(ctx, run)  # the like runs' index, for the forecasts of later runs
    elif run.forecast and found.step is None and (why := forecast.unusable(summary)) is not None:
        event(ctx, run, "warning", f"the trainer's figures were not taken as a measurement: {why}")
    ctx.queues.send(Step.release, StepMessage(org=run.org, run_id=run.id))


def success_reason(run: RunRecord, step: object, planned: object) -> str:
    if step is not None:
        return (f"adapter verified: the checkpoint at step {step} of {planned} (training stopped before the final "
                "adapter), accepted as the run's adapter")
    if run.finished_at_limit:
        return ("adapter verified; the runtime limit passed after the training finished all its planned steps: the "
                "final eval and the base-vs-adapter samples were cut")
    return "adapter verified"


def success_fields(run: RunRecord, summary: dict[str, object], found: Found) -> dict[str, object]:
    """The run fields a verified adapter records."""
    # verify_saved has no sha256 from a report or an upload: record the bytes verified here, so
    # the adapter served later is exactly this one (shared/services/api/runs/adapter.py checks it).
    recorded: dict[str, object] = {} if run.adapter_sha256 else {
        "adapter_sha256": found.sha256, "adapter_size": found.size}
    recorded |= {"verify_progress": None, "adapter_kind": "final" if found.step is None else "checkpoint",
                 "checkpoint_step": found.step,
                 "planned_steps": found.planned if isinstance(found.planned, int) else None}
    checked = forecast.compare(run.forecast, summary) if run.forecast and found.step is None else None
    if checked is not None:
        recorded["forecast_check"] = checked
    return recorded


def check_merged(ctx: Context, run: RunRecord, spooled: verify_spool.Spooled | str | None) -> dict[str, object]:
    """The run fields that record its merged model: kept when the archive the agent reported passes
    adapter_format.merged, cleared with merged_note saying why when it does not or none was reported."""
    # lazy: adapter_format.verify loads numpy (about 0.1 s more on every cold start)
    from adapter_format.merged import verify_merged

    if not run.merged_sha256:
        # The trainer's merge or the agent's export failed (each says why in the run's log), or the adapter was
        # recovered without a completion of the agent's, which is what reports a merged model.
        return {"merged_note": "no merged model: the machine did not make one or report it (the run's log says why)"}
    try:
        if not isinstance(spooled, verify_spool.Spooled):
            raise ValueError(spooled or f"no merged archive at {merged_key(run.id)} in storage")
        with verify_spool.open_spooled(spooled) as archive:
            hub_model = kept(ctx, run.org, run.base_model, run.base_model_revision)
            problems = unreadable_is_refused(lambda: verify_merged(
                archive, base_model=run.base_model, expected_sha256=run.merged_sha256, model=hub_model)).problems
    except ValueError as exc:
        problems = [str(exc)]
    if problems:
        return {"merged_sha256": "", "merged_size": 0,
                "merged_note": "no merged model: its verification failed: " + "; ".join(problems)}
    return {"merged_note": ""}


def refuse_recovery(ctx: Context, run: RunRecord, refusal: str, sha256: str) -> None:
    """Back to retained with why it was retained first and the refusal second (the refusal alone hid
    why the run needed recovering), said as a warning on the timeline with the refused archive's
    digest, which is not recorded as the run's adapter: no adapter of it was accepted."""
    first = run.retained_reason.rstrip(". ")
    reason = f"{first}. Recovery refused: {refusal}" if first else f"recovery refused: {refusal}"
    moved, did = move(ctx, run, RunState.retained, expect={RunState.recovering}, reason=reason,
                      adapter_sha256="", adapter_size=0, verify_progress=None)
    if did:
        event(ctx, moved, "warning", f"recovery refused: {refusal}", **({"refused_sha256": sha256} if sha256 else {}))
