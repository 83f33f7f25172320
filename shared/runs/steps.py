"""The table of queue-triggered steps: one row per step, the one place that says which step
serves which run state.

A row holds the step's name, which is also its queue's name and the name in logs and
step-error events (the module in functions/, the Azure function and the service handler
are its snake_case: verify-adapter -> functions/verify_adapter.py, services/verify_adapter.py);
the message model its queue carries; the service function that handles it; the run states
it serves (for a run in any other state it does nothing, which is what makes duplicate and
late deliveries harmless); and who sends its message again when one is lost.

Derived from it: the queue names (shared.queues.Queue is Step), the steps' state guards,
the heartbeat-check's re-sends, the sweeper's retries of stuck releases, and the chaos test's
list of run steps. tests/test_steps.py checks the function app registers exactly these queues.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from shared.models import ConnectionMessage, RunState, StepMessage


class Step(StrEnum):
    """A step's name, which is its queue's name."""

    validate_connection = "validate-connection"
    refresh_catalog = "refresh-catalog"
    launch = "launch"
    verify_adapter = "verify-adapter"
    retain = "retain"
    release = "release"

    @property
    def poison(self) -> str:
        """Where the host moves a message that failed maxDequeueCount times."""
        return f"{self.value}-poison"

    @property
    def snake(self) -> str:
        """The name of its module in functions/ and shared/services/, and of its function."""
        return self.value.replace("-", "_")

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
    # "module:function", imported on first delivery: loading the function app loads no service.
    handler: str
    serves: frozenset[RunState]
    # None for the connection steps: an owner runs the check again; the hourly timer refreshes.
    resent_by: Resender | None

    def handler_function(self) -> Callable[[Any], object]:
        module, _, name = self.handler.partition(":")
        fn: Callable[[Any], object] = getattr(importlib.import_module(module), name)
        return fn


S = RunState

TABLE: dict[Step, StepSpec] = {spec.step: spec for spec in (
    StepSpec(Step.validate_connection, ConnectionMessage, "shared.services.connections:validate_connection",
             frozenset(), None),
    StepSpec(Step.refresh_catalog, ConnectionMessage, "shared.services.catalog:refresh_catalog",
             frozenset(), None),
    # queued: the launch writes provisioning (and the machine's name) before any cloud call.
    StepSpec(Step.launch, StepMessage, "shared.services.launch:launch",
             frozenset({S.queued, S.provisioning}), Resender.heartbeat_check),
    StepSpec(Step.verify_adapter, StepMessage, "shared.services.verify_adapter:verify_adapter",
             frozenset({S.verifying, S.recovering}), Resender.heartbeat_check),
    StepSpec(Step.retain, StepMessage, "shared.services.retain:retain",
             frozenset({S.retaining}), Resender.heartbeat_check),
    StepSpec(Step.release, StepMessage, "shared.services.release:release",
             frozenset({S.releasing}), Resender.sweeper),
)}

# The steps that act on runs, in the order a run meets them.
RUN_STEPS: tuple[Step, ...] = tuple(step for step, spec in TABLE.items() if spec.serves)


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
