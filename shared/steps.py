"""The table of queue-triggered steps: one row per step, the one place that says which step
serves which run state.

A row holds the step's name, which is also its queue's name and the name in logs and
step-error events (the module in functions/, the Azure function and the service handler
are its snake_case: verify-adapter -> functions/verify_adapter.py calls
shared/services/steps/verify_adapter.py:verify_adapter); the message model its queue carries; the
run states it serves (for a run in any other state it does nothing, which is what makes duplicate
and late deliveries harmless); and who sends its message again when one is lost.

The handler itself is named where the queue trigger is registered (functions/<step>.py passes the
service function to shared/services/steps/runner.run_step): this table is imported by every module
that sends a message, the steps included, so it holds no reference to them.

Derived from it: the queue names (shared.queues.Queue is Step), the steps' state guards, the step
that takes a run in a given state (`serving`), the heartbeat-check's re-sends, the sweeper's retries
of stuck releases, and the chaos test's list of run steps. tests/test_steps.py checks the function
app registers exactly these queues.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel

from shared.models import ConnectionMessage, RunState, StepMessage, SweepMessage
from shared.webhooks.models import DeliveryMessage


class Step(StrEnum):
    """A step's name, which is its queue's name."""

    validate_connection = "validate-connection"
    refresh_catalog = "refresh-catalog"
    launch = "launch"
    verify_adapter = "verify-adapter"
    retain = "retain"
    release = "release"
    sweep_account = "sweep-account"
    stop_idle = "stop-idle"
    deliver_webhook = "deliver-webhook"

    @property
    def poison(self) -> str:
        """Where the host moves a message that failed maxDequeueCount times."""
        return f"{self.value}-poison"

    @property
    def spec(self) -> StepSpec:
        return TABLE[self]

    @property
    def serves(self) -> frozenset[RunState]:
        return TABLE[self].serves


class Resender(StrEnum):
    """Who sends a step's message again when one is lost (a crash between a write and its
    send, or a poisoned message)."""

    heartbeat_check = "heartbeat-check"  # once the run sat quiet in a state the step serves
    sweeper = "sweeper"  # with the run's own capped backoff (release_after, release_attempts)


@dataclass(frozen=True)
class StepSpec:
    step: Step
    message: type[BaseModel]
    serves: frozenset[RunState]
    # None for the connection steps (an owner runs the check again; the hourly timer refreshes) and
    # for the timers' fan-out steps (the next tick sends them again while there is work).
    resent_by: Resender | None


S = RunState

TABLE: dict[Step, StepSpec] = {spec.step: spec for spec in (
    StepSpec(Step.validate_connection, ConnectionMessage, frozenset(), None),
    StepSpec(Step.refresh_catalog, ConnectionMessage, frozenset(), None),
    # queued: the launch writes provisioning (and the machine's name) before any cloud call.
    StepSpec(Step.launch, StepMessage, frozenset({S.queued, S.provisioning}), Resender.heartbeat_check),
    StepSpec(Step.verify_adapter, StepMessage, frozenset({S.verifying, S.recovering}), Resender.heartbeat_check),
    StepSpec(Step.retain, StepMessage, frozenset({S.retaining}), Resender.heartbeat_check),
    StepSpec(Step.release, StepMessage, frozenset({S.releasing}), Resender.sweeper),
    # The sweeper timer's fan-out: one message per compute connection (shared/services/timers/sweeper).
    StepSpec(Step.sweep_account, SweepMessage, frozenset(), None),
    # heartbeat-check's: stop a retained run's machine started for recovery and left idle. It serves no
    # state of its own (a retained run is no step's); the handler checks the run is retained and idle.
    StepSpec(Step.stop_idle, StepMessage, frozenset(), None),
    # One delivery of one event to one webhook endpoint; its own retries are messages to itself with a delay
    # (shared/services/steps/deliver_webhook.py); a lost one is queued again from the run's outbox.
    StepSpec(Step.deliver_webhook, DeliveryMessage, frozenset(), None),
)}


def serving(state: RunState) -> Step | None:
    """The step that takes a run in `state` (None for the agent's phases, retained and the ends)."""
    return next((spec.step for spec in TABLE.values() if state in spec.serves), None)


def resent_by(who: Resender) -> dict[RunState, Step]:
    """The run states whose lost message `who` sends again, each with the step that serves it."""
    return {state: spec.step for spec in TABLE.values() if spec.resent_by == who for state in spec.serves}


def _check() -> None:
    missing = set(Step) - set(TABLE)
    if missing:
        raise RuntimeError(f"steps without a row in the step table: {sorted(missing)}")
    served: dict[RunState, Step] = {}
    for spec in TABLE.values():
        for state in spec.serves:
            if state in served:
                raise RuntimeError(f"run state {state} is served by both {served[state]} and {spec.step}")
            served[state] = spec.step


_check()
