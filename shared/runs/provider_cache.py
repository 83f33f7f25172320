"""Compute providers built from saved connections, kept in this process per connection version.

Building a provider opens its sealed config and builds its SDK clients: about 0.2-0.27 s of CPU for a
boto3 session and client, against about 10 ms for a listing through a client already built. The account
sweep, heartbeat-check and every step build the provider of a connection again and again, so the
provider is kept and reused while its connection is the same:

- the key is the connection's version: org, slot, provider, revision, saved_at and a digest of the sealed
  config (a save or a key rotation reseals, with a new nonce, so any rewrite of the secrets misses), plus,
  for a provider that takes part of its config from the org's storage connection (RunPod's volume), that
  connection's version too; and the settings object (tests and a reload build new settings);
- bounded (LRU, CACHE_SIZE entries: a boto3 client holds about 1.4 MB), under one lock, so concurrent
  invocations share one provider (the providers' SDK clients are thread-safe; each provider builds them
  under its own lock);
- the unsealed config lives only in this process's memory, inside the provider, as it did per invocation;
  its secrets are registered for log redaction again on every hit;
- a provider served by a test override (registry.override) is never cached: each call builds one, as the
  override's factory expects.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from shared.log import register_secret
from shared.models import ConnectionRecord
from shared.providers.base import ComputeProvider

# Accounts swept every interval (a watched run, or a run ended within a day) stay warm; an hourly one
# usually misses (a miss costs one provider build, with boto3's shared session about 10-20 ms).
CACHE_SIZE = 128

_lock = threading.Lock()
_cache: OrderedDict[tuple[Any, ...], tuple[ComputeProvider, tuple[str, ...], Any]] = OrderedDict()
_stats = {"hits": 0, "builds": 0}


def version_of(rec: ConnectionRecord | None) -> tuple[Any, ...]:
    """What identifies one saved version of a connection (None: no such connection)."""
    if rec is None:
        return ("-",)
    digest = hashlib.sha256(rec.sealed.encode()).hexdigest()[:32]
    return (rec.org, rec.slot, rec.provider, rec.revision, rec.saved_at.isoformat(), digest)


def get(key: tuple[Any, ...], keep: Any, build: Callable[[], tuple[ComputeProvider, list[str]]]) -> ComputeProvider:
    """The provider cached under `key`, or `build()`'s (provider, its secret values), cached. `keep` is
    held with the entry (the settings object whose id is part of the key: an id is never reused while
    the object lives)."""
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
    if hit is not None:
        for secret in hit[1]:
            register_secret(secret)
        return hit[0]
    provider, secrets = build()  # outside the lock: a build calls no cloud, but takes 10-300 ms of CPU
    with _lock:
        _stats["builds"] += 1
        if key in _cache:  # built meanwhile by another invocation: share that one
            _cache.move_to_end(key)
            return _cache[key][0]
        _cache[key] = (provider, tuple(secrets), keep)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return provider


def stats() -> dict[str, int]:
    with _lock:
        return {**_stats, "size": len(_cache)}


def clear() -> None:
    """Forget every cached provider (tests; a process that must drop the unsealed configs)."""
    with _lock:
        _cache.clear()
        _stats.update(hits=0, builds=0)
