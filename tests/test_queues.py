"""queues.configure(): the one place that sets how the process's queues send, with an undo."""

from __future__ import annotations

from shared import queues
from shared.models import StepMessage
from shared.queues import Queue, get_queues


def test_configure_scales_delays_and_calls_hooks_for_undelayed_sends(env: dict[str, str]) -> None:
    woken: list[str] = []
    undo = queues.configure(delay_scale=0, on_send=[woken.append])
    msg = StepMessage(org="o", run_id="r-1")
    get_queues().send(Queue.retain, msg, delay_s=600)  # scaled to 0: visible at once, hook called
    assert get_queues().length(Queue.retain.value) == 1 and woken == ["retain"]
    undo()
    assert get_queues().delay_scale == 1.0 and get_queues().on_send == ()
    get_queues().send(Queue.release, msg, delay_s=600)  # a real delay now: invisible, no hook
    assert woken == ["retain"]
    assert list(get_queues().client(Queue.release.value).receive_messages(visibility_timeout=1)) == []


def test_configure_applies_to_queues_built_later_and_reset_forgets_it(env: dict[str, str]) -> None:
    queues.reset_queues()  # nothing built yet
    undo = queues.configure(delay_scale=0)
    assert get_queues().delay_scale == 0
    undo()
    assert get_queues().delay_scale == 1.0
    queues.configure(delay_scale=0)
    queues.reset_queues()
    assert get_queues().delay_scale == 1.0
