"""The step table (shared/steps.py) and everything derived from it agree: the function
app's queue triggers, the handlers, the heartbeat-check's and the sweeper's re-sends; and a
step delivered for a run in a state it does not serve leaves the run as it is."""

from __future__ import annotations

import base64
import importlib
from pathlib import Path
from typing import cast

import azure.functions as func
import pytest

from shared.context import Context
from shared.lifecycle import HOLDS_MACHINE, PHASE_ORDER, transition
from shared.models import RunState, StepMessage
from shared.queues import Queue, Queues, encode
from shared.steps import TABLE, Resender, Step, resent_by
from shared.store import Store
from tests.fakes import Cloud
from tests.harness import Harness
from tests.support.steps import RUN_STEPS, snake

ROOT = Path(__file__).resolve().parents[1]


def queue_functions() -> dict[str, list[tuple[str, str]]]:
    """queue name -> [(function name, module)] for every queue trigger function_app registers."""
    import function_app
    from shared.function_index import functions_of

    found: dict[str, list[tuple[str, str]]] = {}
    for fn in functions_of(function_app.app):
        trig = fn.get_trigger().get_dict_repr()
        if trig["type"] == "queueTrigger":
            user = fn.get_user_function()
            found.setdefault(trig["queueName"], []).append((fn.get_function_name(), user.__module__))
    return found


def test_every_queue_trigger_is_a_step_and_every_step_has_one() -> None:
    found = queue_functions()
    assert set(found) <= {s.value for s in Step}, f"queue triggers on queues the step table lacks: {found}"
    for step in Step:
        assert found.get(step.value) == [(snake(step), f"functions.{snake(step)}")], (
            f"step {step.value}: expected one function {snake(step)} in functions/{snake(step)}.py, got "
            f"{found.get(step.value)}")


def test_queue_names_are_the_step_names() -> None:
    assert Queue is Step
    assert [s.value for s in Step] == ["validate-connection", "refresh-catalog", "launch", "verify-adapter",
                                       "retain", "release", "sweep-account", "stop-idle", "deliver-webhook"]


@pytest.mark.parametrize("step", list(Step), ids=str)
def test_handler_is_named_as_the_step_and_exists(step: Step) -> None:
    # functions/<step>.py hands run_step the handler of the step's own service module, named as the step.
    service = importlib.import_module(f"functions.{snake(step)}").step
    assert service.__name__ == f"shared.services.steps.{snake(step)}"
    assert callable(getattr(service, snake(step)))
    assert (ROOT / "shared" / "services" / "steps" / f"{snake(step)}.py").is_file()


def test_resends_derive_from_the_table() -> None:
    from shared.services.steps import sweep_account as sweeper
    from shared.services.timers import heartbeat_check

    S = RunState
    assert heartbeat_check.RESEND == {S.queued: Step.launch, S.provisioning: Step.launch,
                                      S.verifying: Step.verify_adapter, S.recovering: Step.verify_adapter,
                                      S.retaining: Step.retain}
    assert sweeper.RESENDS == {S.releasing: Step.release}
    assert set(heartbeat_check.VERIFY_GIVE_UP) == Step.verify_adapter.serves
    # Every state that served is re-sent by someone; no state is left to nobody.
    assert set(resent_by(Resender.heartbeat_check)) | set(resent_by(Resender.sweeper)) == \
        {s for spec in TABLE.values() for s in spec.serves}


def test_every_state_holding_a_machine_has_an_owner() -> None:
    # The agent's phases are the agent's (and the heartbeat deadlines'); retained waits for a user.
    agent_phases = set(PHASE_ORDER) - {RunState.provisioning, RunState.verifying}
    served = {s for spec in TABLE.values() for s in spec.serves}
    assert served | agent_phases | {RunState.retained} == set(HOLDS_MACHINE)
    assert RUN_STEPS == (Step.launch, Step.verify_adapter, Step.retain, Step.release)


@pytest.mark.parametrize("step", RUN_STEPS, ids=str)
def test_a_step_ignores_a_run_in_a_state_it_does_not_serve(harness: Harness, cloud: Cloud, step: Step) -> None:
    run_id = harness.create_run("memory", "mem-a10")  # a draft: no step serves it
    before = harness.get_run(run_id)
    body = base64.b64decode(encode(StepMessage(org=harness.org, run_id=run_id)))
    harness.queue_fns[step.value](func.QueueMessage(id="m-1", body=body, pop_receipt="r"))
    after = harness.get_run(run_id)
    assert after["state"] == "draft" and after["updated_at"] == before["updated_at"]
    assert after["events"] == before["events"]
    assert not cloud.calls[2:], cloud.calls  # only the connection check's validate and offers ran


def test_launch_claim_is_granted_once_per_settle_period(harness: Harness, cloud: Cloud) -> None:
    from shared.models import CloudResource
    from shared.services.steps.launch import launch_settle_s
    from shared.store import get_store
    from shared.store.leases import claim_launch

    settle, store = launch_settle_s(), get_store()
    run_id = harness.create_run("memory", "mem-a10")
    store.runs.mutate(harness.org, run_id, lambda r: transition(r, RunState.queued))
    run, _ = store.runs.mutate(harness.org, run_id, lambda r: transition(r, RunState.provisioning))
    assert claim_launch(harness.ctx, harness.org, run_id, settle_s=settle) == (run, False)  # just written
    harness.clock.advance(settle + 1)
    claimed, granted = claim_launch(harness.ctx, harness.org, run_id, settle_s=settle)
    assert granted and claimed.updated_at > run.updated_at
    assert claim_launch(harness.ctx, harness.org, run_id, settle_s=settle) == (claimed, False)  # claimed just now
    harness.clock.advance(settle + 1)
    res = CloudResource(provider="memory", kind="instance", id="i-1", run_id=run_id, org=harness.org)
    launched, _ = store.runs.mutate(harness.org, run_id, lambda r: r.model_copy(update={"resources": [res]}))
    assert claim_launch(harness.ctx, harness.org, run_id, settle_s=settle) == (launched, False)  # launched already


def test_two_deliveries_verifying_at_once_record_the_adapter_once(harness: Harness, cloud: Cloud) -> None:
    """Two deliveries read the run in verifying and both verify; the later one's move finds the run moved
    and records nothing: one 'adapter verified' event, one release message."""
    from shared.services.steps import verify_adapter as step
    from shared.store import get_store
    from tests.harness import trained_adapter_zip

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).train(trained_adapter_zip())  # the first delivery verified it, and the run ended
    done, etag = get_store().runs.get(harness.org, run_id)
    assert done.state == RunState.succeeded
    # The second delivery read the run before the first one's write: in verifying.
    stale = done.model_copy(update={"state": RunState.verifying})
    store = get_store()
    # Its reads of the run see it in verifying; every other call reaches the real store.
    runs = type("Runs", (), {"get": lambda self, org, rid: (stale, etag),
                             "__getattr__": lambda self, n: getattr(store.runs, n)})()
    stale_store = type("S", (), {"runs": runs, "__getattr__": lambda self, n: getattr(store, n)})()
    sent: list[object] = []
    queues = type("Q", (), {"send": lambda self, *a, **kw: sent.append(a)})()
    step.verify_adapter(Context(harness.ctx.settings, cast(Store, stale_store), cast(Queues, queues)),
                        StepMessage(org=harness.org, run_id=run_id))
    verified = [e for e in get_store().events.read(run_id, "audit") if e.message.startswith("adapter verified")]
    assert len(verified) == 1, verified
    assert sent == [], sent  # no second release message
    assert harness.get_run(run_id)["state"] == "succeeded"


def test_a_throttled_release_waits_as_long_as_the_cloud_asked(harness: Harness, cloud: Cloud, monkeypatch) -> None:
    """Azure's Compute throttling asks for up to 20 minutes: the release's own backoff (15 s, 30 s, ...) would
    retry early and count against the same limit."""
    from shared.errors import ThrottledError
    from shared.services.steps import release as step
    from shared.store import get_store
    from tests.harness import trained_adapter_zip

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    real = step.compute_for
    release = step.release

    class Throttled:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def release(self, *args: object) -> object:
            raise ThrottledError("PutVM3Min: too many requests", code="TooManyRequests", retry_after_s=1200)

    monkeypatch.setattr(step, "compute_for", lambda ctx, org, provider: Throttled(real(ctx, org, provider)))
    sent: list[float] = []

    def release_sending_aside(ctx: Context, msg: StepMessage) -> None:
        """The release step, its own release messages kept aside (their delays) and the rest sent."""
        queues = ctx.queues
        aside = type("Q", (), {
            "send": lambda self, s, m, delay_s=0.0: sent.append(delay_s) if s == Step.release else queues.send(s, m),
            "__getattr__": lambda self, n: getattr(queues, n)})()
        release(Context(ctx.settings, ctx.store, cast(Queues, aside)), msg)

    monkeypatch.setattr(step, "release", release_sending_aside)
    harness.agent(run_id).train(trained_adapter_zip())  # verified; its release is throttled
    run, _ = get_store().runs.get(harness.org, run_id)
    assert run.state == RunState.releasing and run.release_attempts == 1, run
    assert sent == [1200], sent


def test_an_archive_the_verifier_cannot_read_is_refused_not_poison(harness: Harness, cloud: Cloud, monkeypatch) -> None:
    """An error the verifier did not foresee on an untrusted archive is a refusal: the run is retained with
    why, where the step used to fail until its message was set aside as poison."""
    import adapter_format.verify as verify
    from tests.harness import trained_adapter_zip

    def unforeseen(*args: object, **kw: object) -> object:
        raise NotImplementedError("zip file version 9.6")

    monkeypatch.setattr(verify, "verify_adapter", unforeseen)
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).train(trained_adapter_zip())
    run = harness.get_run(run_id)
    assert run["state"] == "retained", run
    assert "could not be read by the verifier (NotImplementedError: zip file version 9.6)" in run["reason"], run
