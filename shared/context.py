"""The invocation context: what a service uses of the process (settings, the state store, the queues),
built once per invocation by the edges and handed down explicitly.

The edges are the step runner (shared/services/steps/runner.py, one per queue message), the HTTP
edge (shared/http.py `respond`, one per request) and the timer triggers (functions/*.py). Every
service, step and run-domain function that reads the store, the queues or the settings takes
`ctx: Context` as its first parameter; none of them calls get_store(), get_queues() or
get_settings() (tests/test_context.py holds that by an ast check). A test or a tool that calls a
service builds its own Context (`Context(settings, store, queues)`) or takes the process's
(`invocation()`).

Why explicit and not a contextvar: a service's signature says what it touches, a test swaps a store
by passing another one, and nothing reads a global that a thread or a fork forgot to set.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.queues import Queues, get_queues
from shared.settings import Settings, get_settings
from shared.store.repo import Store, get_store


@dataclass(frozen=True)
class Context:
    settings: Settings
    store: Store
    queues: Queues


def invocation() -> Context:
    """The process's context for one invocation: the one place that reads the process-wide settings,
    store and queues (each built once per process and shared, as the Functions host reuses a worker)."""
    return Context(settings=get_settings(), store=get_store(), queues=get_queues())
