"""The CLI's side of candidates and failover (issue 37): `runs create --offer a,b,c` (each CONNECTION:OFFER or
a plain offer on --provider), `--fallback fitting`, `--capacity-wait`; `runs get` shows the candidates and
every attempt; `runs watch` prints a line per attempt. The views the CLI renders are real ones: a run
that failed over on the in-memory cloud, served to the CLI as the API answered them."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from shared.errors import CapacityError
from tests.fake_api import FakeApi, run_cli
from tests.fakes import Cloud, serve_memory
from tests.harness import Harness
from tests.test_failover import FourOffers, _run


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    """The memory provider for this module: four offers to fail over between (tests/test_failover.py)."""
    yield from serve_memory(Cloud(), FourOffers)


def _body(api: FakeApi) -> dict[str, Any]:
    [sent] = api.sent("POST", "/api/runs")
    return dict(json.loads(sent["body"]))


def _create(api: FakeApi, *argv: str) -> dict[str, Any]:
    api.on("POST", "/api/runs", {"id": "r-1", "state": "draft", "offer": {}}, status=201)
    assert run_cli(api, "runs", "create", "--project", "p1", "--dataset", "d1", "--base-model", "m",
                   "--price-limit", "3", *argv) == 0
    return _body(api)


def test_offer_list_becomes_the_candidates(fake_api: FakeApi) -> None:
    body = _create(fake_api, "--offer", "aws:us-east-1/us-east-1a/g6.xlarge,azure:azure:eastus:Standard_NC24ads_A100_v4,"
                                        "runpod-secure-eu-ro-1-nvidia-a40", "--provider", "runpod",
                   "--capacity-wait", "1800")
    assert body["candidates"] == [
        {"connection": "aws", "offer_id": "us-east-1/us-east-1a/g6.xlarge"},
        {"connection": "azure", "offer_id": "azure:eastus:Standard_NC24ads_A100_v4"},
        {"connection": "runpod", "offer_id": "runpod-secure-eu-ro-1-nvidia-a40"}]
    assert body["provider"] == "aws" and body["offer_id"] == "us-east-1/us-east-1a/g6.xlarge"
    assert body["capacity_wait_s"] == 1800


def test_an_azure_offer_id_is_read_whole_and_a_named_connection_is_kept(fake_api: FakeApi) -> None:
    body = _create(fake_api, "--offer", "azure:eastus:Standard_NC24ads_A100_v4,aws/us-west-2:us-west-2/us-west-2a/g6.xlarge",
                   "--fallback", "fitting")
    assert body["candidates"][0] == {"connection": "azure", "offer_id": "azure:eastus:Standard_NC24ads_A100_v4"}
    assert body["candidates"][1] == {"connection": "aws/us-west-2", "offer_id": "us-west-2/us-west-2a/g6.xlarge"}
    assert body["fallback"] == "fitting"


def test_a_single_plain_offer_sends_no_candidates(fake_api: FakeApi) -> None:
    body = _create(fake_api, "--offer", "local-smoke", "--provider", "local")
    assert body["provider"] == "local" and body["offer_id"] == "local-smoke" and "candidates" not in body


def test_a_plain_offer_without_provider_is_refused_with_the_fix(fake_api: FakeApi,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(fake_api, "runs", "create", "--project", "p1", "--dataset", "d1", "--base-model", "m",
                   "--price-limit", "3", "--offer", "g6.xlarge") != 0
    assert "CONNECTION:OFFER" in capsys.readouterr().err
    assert not fake_api.sent("POST", "/api/runs")


def _failed_over_view(harness: Harness, cloud: Cloud) -> dict[str, Any]:
    cloud.refuse["mem.a10"] = CapacityError("InsufficientInstanceCapacity: no A10 left in the zone", code="capacity")
    run_id = _run(harness, ["mem-a10", "mem-l40s"])
    run = harness.launch(run_id)
    assert [a["outcome"] for a in run["attempts"]] == ["refused", "launched"]
    return dict(run)


def test_runs_get_shows_candidates_and_attempts(harness: Harness, cloud: Cloud, fake_api: FakeApi,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = _failed_over_view(harness, cloud)
    fake_api.on("GET", f"/api/runs/{run['id']}", run)
    assert run_cli(fake_api, "runs", "get", run["id"]) == 0
    out = capsys.readouterr().out
    assert "candidate 1: memory mem-a10 (A10" in out and "candidate 2: memory mem-l40s (L40S" in out
    assert "ran on: memory mem-l40s (L40S" in out
    assert "attempt 1: memory mem-a10 (A10, $1.01/h) refused capacity" in out, out
    assert "no A10 left" in out
    assert "attempt 2: memory mem-l40s (L40S, $1.81/h) launched" in out


def test_runs_watch_prints_a_line_per_attempt(harness: Harness, cloud: Cloud, fake_api: FakeApi) -> None:
    from tensorant_cli.client import Client
    from tensorant_cli.commands.watch import watch

    run = _failed_over_view(harness, cloud)
    fake_api.on("GET", f"/api/runs/{run['id']}", run)
    fake_api.on("GET", f"/api/runs/{run['id']}/logs", {"lines": [], "next": None})
    out = io.StringIO()
    watch(Client(fake_api.url, "tok-123"), run["id"], interval=0, stream=out, max_polls=2)
    text = out.getvalue()
    lines = [line for line in text.splitlines() if "attempt " in line]
    assert len(lines) == 2, text
    assert "attempt 1: memory mem-a10" in lines[0] and "refused capacity" in lines[0]
    assert "attempt 2: memory mem-l40s" in lines[1] and "launched" in lines[1]
    assert "warning: attempt 1" not in text  # the refusal's event is not said twice
