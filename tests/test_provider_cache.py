"""Providers and their SDK clients are kept per connection version (shared/runs/provider_cache.py): the
real AWS provider against moto builds its boto3 client once for many sweeps, and again after the
connection is saved (a rotated key), never per invocation."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.models import ConnectionRecord, ConnectionStatus
from shared.runs import provider_cache
from tests.harness import Harness
from tests.providers.aws.rig import Rig


@pytest.fixture
def aws_h(env: dict[str, str], rig: Rig, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Harness, list[str]]]:
    """A connected aws connection on moto, built by the registry's own factory (no override: cached),
    and the list of boto3 clients made meanwhile (service names)."""
    from shared.providers.aws import client

    monkeypatch.setenv("AWS_ENDPOINT_URL", rig.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", rig.pricing.url)
    made: list[str] = []
    original = client.AwsClient._new_client

    def counting(self: Any, service: str) -> Any:
        made.append(service)
        return original(self, service)

    monkeypatch.setattr(client.AwsClient, "_new_client", counting)
    provider_cache.clear()
    h = Harness()
    assert h.save_storage({"kind": "local"})["status"] == "connected"
    assert h.save_compute("aws", rig.body())["status"] == "connected"
    yield h, made
    h.close()
    provider_cache.clear()


def sweep(org: str) -> dict[str, Any]:
    from shared.context import invocation
    from shared.services.steps.sweep_account import sweep_one

    return sweep_one(invocation(), org, "aws", sweep_id=f"s{time.monotonic_ns()}", dry_run=False)


def test_the_client_is_built_once_for_many_sweeps_and_again_after_a_save(aws_h: tuple[Harness, list[str]],
                                                                          rig: Rig) -> None:
    from shared.runs.org_backends import compute_for

    h, made = aws_h
    assert "ec2" in made  # the connection check built the provider and its EC2 client
    made.clear()
    for _ in range(3):
        out = sweep(h.org)
        assert "skipped" not in out and out["listed"] == 0, out
    assert made == [], made  # three sweeps (invocations) reuse the check's provider and client
    first = compute_for(h.ctx, h.org, "aws")
    assert compute_for(h.ctx, h.org, "aws") is first

    h.save_compute("aws", rig.body())  # saved again (the same key: a rotation looks the same)
    assert "ec2" in made, made  # the new version's provider has built its own client
    made.clear()
    assert compute_for(h.ctx, h.org, "aws") is not first
    for _ in range(2):
        sweep(h.org)
    assert made == [], made


def test_the_key_is_the_connection_version() -> None:
    base = ConnectionRecord(org="org-a", slot="compute:aws", provider="aws", status=ConnectionStatus.connected,
                            config={}, sealed="v1.abc", saved_at=datetime(2026, 12, 6, tzinfo=UTC), revision=3)
    same = base.model_copy(update={"status": ConnectionStatus.failed, "checks": [], "checked_at": base.saved_at})
    assert provider_cache.version_of(same) == provider_cache.version_of(base)  # a check result is no new version
    for change in ({"revision": 4}, {"sealed": "v1.abd"}, {"saved_at": datetime(2026, 12, 7, tzinfo=UTC)},
                   {"org": "org-b"}):
        assert provider_cache.version_of(base.model_copy(update=change)) != provider_cache.version_of(base), change


def test_the_cache_is_bounded_and_drops_the_least_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provider_cache, "CACHE_SIZE", 3)
    provider_cache.clear()
    built: list[int] = []

    def build(i: int) -> Any:
        def make() -> tuple[Any, list[str]]:
            built.append(i)
            return object(), []
        return make

    for i in range(3):
        provider_cache.get(("k", i), None, build(i))
    provider_cache.get(("k", 0), None, build(0))  # 0 is used again: 1 is now the oldest
    provider_cache.get(("k", 3), None, build(3))
    assert provider_cache.stats()["size"] == 3
    provider_cache.get(("k", 0), None, build(0))
    provider_cache.get(("k", 1), None, build(1))
    assert built == [0, 1, 2, 3, 1]
    provider_cache.clear()
