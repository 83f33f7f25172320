"""The run state machine: one transition table, one transition function."""

from __future__ import annotations

from shared.clock import now
from shared.models import Outcome, RunRecord, RunState

S = RunState

# Active states that a machine may exist in; each can fail over to releasing
# (nothing worth keeping yet) or retaining (keep the disk for recovery).
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    S.draft: frozenset({S.queued, S.cancelled}),
    S.queued: frozenset({S.provisioning, S.releasing}),
    S.provisioning: frozenset({S.preparing, S.releasing, S.retaining}),
    S.preparing: frozenset({S.training, S.releasing, S.retaining}),
    S.training: frozenset({S.exporting, S.releasing, S.retaining}),
    S.exporting: frozenset({S.verifying, S.releasing, S.retaining}),
    S.verifying: frozenset({S.releasing, S.retaining}),
    S.retaining: frozenset({S.retained, S.releasing}),
    # retained -> training: `recover --resume` continues from the last checkpoint on the same machine.
    S.retained: frozenset({S.recovering, S.releasing, S.training}),
    S.recovering: frozenset({S.releasing, S.retained}),
    S.releasing: frozenset({S.succeeded, S.failed, S.cancelled}),
    S.succeeded: frozenset(),
    S.failed: frozenset(),
    S.cancelled: frozenset(),
}

TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
# Where a run in releasing ends once the cloud confirms the release: its outcome's state. A run
# without an outcome (a record written before outcomes existed, or by hand) ends failed.
OUTCOME_STATE: dict[Outcome, RunState] = {
    Outcome.succeeded: S.succeeded,
    Outcome.failed: S.failed,
    Outcome.cancelled: S.cancelled,
}
# States in which the agent is expected to send heartbeats.
ACTIVE = frozenset({S.provisioning, S.preparing, S.training, S.exporting})
# States in which a machine may exist and must eventually be released or retained.
HOLDS_MACHINE = frozenset(set(TRANSITIONS) - TERMINAL - {S.draft})
# The order the agent walks through; heartbeats may skip ahead, never back.
PHASE_ORDER = (S.provisioning, S.preparing, S.training, S.exporting, S.verifying)


class IllegalTransition(Exception):
    def __init__(self, current: RunState, target: RunState) -> None:
        super().__init__(f"a run cannot go from {current.value} to {target.value}: the transition table "
                         "(shared/lifecycle.py) does not allow it")
        self.current = current
        self.target = target


def can_transition(current: RunState, target: RunState) -> bool:
    return target in TRANSITIONS[current]


def transition(
    run: RunRecord, target: RunState, *, reason: str | None = None, outcome: Outcome | None = None
) -> RunRecord:
    """Return the run moved to `target`; raise IllegalTransition for a move the table forbids.

    Entering `releasing` requires an outcome (where the run goes once the cloud confirms
    the release); leaving it goes to exactly that outcome (failed when it has none).
    """
    if not can_transition(run.state, target):
        raise IllegalTransition(run.state, target)
    if run.state == S.releasing and target != released_state(run):
        raise IllegalTransition(run.state, target)
    changes: dict[str, object] = {"state": target, "updated_at": now(), "state_changed_at": now()}
    if target == S.releasing:
        if outcome is None:
            raise ValueError("entering releasing needs an outcome")
        changes["outcome"] = outcome
    if reason is not None:
        changes["reason"] = reason
    return run.model_copy(update=changes)


def check_write(before: RunRecord, after: RunRecord) -> None:
    """Raise IllegalTransition unless a write of `after` over `before` keeps the table: the state as it is,
    a move the table allows (out of releasing: only to its outcome's state), or a walk forward along the
    agent's phase order (a heartbeat may skip phases in one write). The store's one write (Runs.decide)
    calls it before writing, so no caller can move a run the table forbids, however it built the record."""
    a, b = before.state, after.state
    if a == b:
        return
    if a in PHASE_ORDER and b in PHASE_ORDER and PHASE_ORDER.index(b) > PHASE_ORDER.index(a):
        return  # each phase to the next is in the table
    if not can_transition(a, b) or (a == S.releasing and b != released_state(before)):
        raise IllegalTransition(a, b)


def released_state(run: RunRecord) -> RunState:
    """The terminal state a run in releasing goes to once its release is confirmed."""
    return OUTCOME_STATE[run.outcome or Outcome.failed]


def phase_path(current: RunState, target: RunState) -> list[RunState]:
    """The states between current and target along the agent's phase order (target included)."""
    if current not in PHASE_ORDER or target not in PHASE_ORDER:
        raise IllegalTransition(current, target)
    i, j = PHASE_ORDER.index(current), PHASE_ORDER.index(target)
    return list(PHASE_ORDER[i + 1 : j + 1])


def walk(run: RunRecord, target: RunState) -> RunRecord:
    """Return the run moved forward along the agent's phase order to `target`, one transition per
    phase (a heartbeat may skip phases, never go back)."""
    for state in phase_path(run.state, target):
        run = transition(run, state, reason="")
    return run
