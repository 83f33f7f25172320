"""Every legal and every illegal transition of the run state machine."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import product

import pytest

from shared.lifecycle import TERMINAL, TRANSITIONS, IllegalTransition, phase_path, transition
from shared.models import GpuOffer, Outcome, RunKind, RunRecord, RunState

T = datetime(2026, 1, 1, tzinfo=UTC)
OFFER = GpuOffer(provider="local", offer_id="o", gpu="x", gpu_memory_gb=1, machine_type="m", region="r",
                 compute_per_hour=0, disk_per_hour=0, total_per_hour=0)


def run_in(state: RunState, outcome: Outcome | None = None) -> RunRecord:
    return RunRecord(org="o", id="r-1", project_id="p", kind=RunKind.trial, provider="local", offer=OFFER,
                     price_limit_per_hour=1, runtime_limit_s=60, dataset_version_id="d", base_model="b",
                     state=state, outcome=outcome, created_at=T, updated_at=T, state_changed_at=T)


LEGAL = [(a, b) for a, targets in TRANSITIONS.items() for b in sorted(targets)]  # sets: one order in every xdist worker
ILLEGAL = [(a, b) for a, b in product(RunState, RunState) if b not in TRANSITIONS[a]]


def test_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(RunState)
    assert TERMINAL == {RunState.succeeded, RunState.failed, RunState.cancelled}


@pytest.mark.parametrize(("current", "target"), LEGAL, ids=[f"{a}->{b}" for a, b in LEGAL])
def test_legal(current: RunState, target: RunState) -> None:
    outcome = Outcome(target.value) if current == RunState.releasing else None
    run = run_in(current, outcome)
    new = transition(run, target, reason="why", outcome=Outcome.failed if target == RunState.releasing else None)
    assert new.state == target
    assert new.reason == "why"
    assert run.state == current  # records are immutable: the old one is untouched


@pytest.mark.parametrize(("current", "target"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_illegal(current: RunState, target: RunState) -> None:
    with pytest.raises(IllegalTransition):
        transition(run_in(current), target, outcome=Outcome.failed)


def test_releasing_goes_only_to_its_outcome() -> None:
    run = run_in(RunState.releasing, Outcome.cancelled)
    with pytest.raises(IllegalTransition):
        transition(run, RunState.succeeded)
    assert transition(run, RunState.cancelled).state == RunState.cancelled


def test_entering_releasing_needs_an_outcome() -> None:
    with pytest.raises(ValueError, match="outcome"):
        transition(run_in(RunState.verifying), RunState.releasing)


def test_phase_path_walks_forward_only() -> None:
    assert phase_path(RunState.provisioning, RunState.exporting) == [
        RunState.preparing, RunState.training, RunState.exporting]
    assert phase_path(RunState.training, RunState.preparing) == []


def test_a_retained_run_resumes_to_training_only() -> None:
    # `recover --resume`: back to training on the same machine; no other active phase.
    assert transition(run_in(RunState.retained), RunState.training).state == RunState.training
    for target in (RunState.provisioning, RunState.preparing, RunState.exporting, RunState.verifying):
        with pytest.raises(IllegalTransition):
            transition(run_in(RunState.retained), target)
