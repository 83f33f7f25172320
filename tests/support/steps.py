"""Views of the step table (shared/steps.py) that only tests read."""

from __future__ import annotations

from shared.steps import TABLE, Step

# The steps that act on runs, in the order a run meets them.
RUN_STEPS: tuple[Step, ...] = tuple(step for step, spec in TABLE.items() if spec.serves)


def snake(step: Step) -> str:
    """The name of its module in functions/ and shared/services/steps/, and of its function."""
    return step.value.replace("-", "_")
