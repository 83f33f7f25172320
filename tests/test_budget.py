"""Every invocation bounded well under the Functions host's functionTimeout (shared/budget.py).

How this fails when someone adds a function without thinking about time:
- `test_every_function_declares_its_bound`: every function the app registers (HTTP route, queue
  step, timer) must be in budget.BOUNDS with the kind that says how it stays bounded. A new route
  fails here until its author states whether it reaches a cloud inline.
- `test_slow_azure_flow_stays_within_every_bound`: the whole life of an Azure run (connection
  check, catalog refresh, launch, retain on a timeout, recovery's machine start and stop, verify,
  release), with every long-running operation taking 150 s and VM reads throttled with a 10-s
  Retry-After, through the real handlers on the simulated clock. Every invocation of every function
  (HTTP, queue, timer) is timed on that clock and held to its declared bound; the run still ends
  succeeded, through the steps' delayed messages to themselves.
- `test_the_measure_catches_an_unbounded_wait`: the same measure with unbudgeted waits (up to
  functionTimeout per operation) finds the launch over its bound, so the flow test is able to fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shared import budget
from tests.harness import Harness, trained_adapter_zip
from tests.providers.azure.fake_arm import FakeArm
from tests.support.clock import FakeClock

SLOW_OP_S = 150.0  # each Azure long-running operation: far past one invocation's budget


# ---------------------------------------------------------------- the numbers


def test_bounds_follow_function_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(budget.TIMEOUT_SETTING, raising=False)
    assert budget.function_timeout_s() == 300  # host.json's 00:05:00
    assert budget.invocation_bound_s() == 100 and budget.step_budget_s() == 80
    assert budget.http_bound_s() == 100
    monkeypatch.setenv(budget.TIMEOUT_SETTING, "00:10:00")  # the app setting overrides host.json, as in Azure
    assert budget.function_timeout_s() == 600 and budget.invocation_bound_s() == 200
    assert budget.http_bound_s() == 200
    monkeypatch.setenv(budget.TIMEOUT_SETTING, "01:00:00")  # Premium: HTTP is still cut at about 230 s
    assert budget.http_bound_s() == budget.HTTP_CUT_S
    monkeypatch.setenv(budget.TIMEOUT_SETTING, "-1")
    assert budget.invocation_bound_s() == 100  # no limit: held to the Consumption default's third
    monkeypatch.setenv(budget.TIMEOUT_SETTING, "five minutes")
    with pytest.raises(ValueError, match="timespan"):
        budget.function_timeout_s()


def test_deadline_bounds_waits_on_the_core_clock() -> None:
    from shared import clock

    fake = FakeClock()
    clock.set_clock(fake)
    try:
        assert budget.remaining(20) == 20 and budget.remaining() == math.inf  # outside an invocation: the cap
        with budget.within(80):
            fake.advance(70)
            assert budget.remaining(20) == 10 and budget.allows(10) and not budget.allows(11)
            with budget.within(60):  # an inner budget never outlasts the outer one
                assert budget.remaining() == 10
            fake.advance(15)
            assert budget.remaining(20) == 0
        assert budget.remaining(20) == 20
    finally:
        clock.set_clock(None)


# ---------------------------------------------------------------- every function declares its bound


def registered() -> dict[str, Any]:
    import function_app
    from shared.function_index import functions_of

    return {fn.get_function_name(): fn for fn in functions_of(function_app.app)}


def test_every_function_declares_its_bound() -> None:
    functions = registered()
    missing = sorted(set(functions) - set(budget.BOUNDS))
    assert missing == [], (
        f"{missing}: declare each in shared/budget.BOUNDS: how long may one invocation take? A route that "
        "reaches a cloud inline is HTTP_CLOUD (each wait capped at LRO_WAIT_S); one that would wait longer "
        "must enqueue a step instead")
    assert sorted(set(budget.BOUNDS) - set(functions)) == [], "BOUNDS names functions the app no longer has"
    for name, fn in functions.items():
        kind = fn.get_trigger().get_dict_repr()["type"]
        expected = {"queueTrigger": {budget.STEP}, "timerTrigger": {budget.TIMER},
                    "httpTrigger": {budget.HTTP, budget.HTTP_CLOUD}}[kind]
        assert budget.BOUNDS[name] in expected, (name, kind, budget.BOUNDS[name])


# ---------------------------------------------------------------- measured on a slow cloud


class Timings:
    """Every invocation's simulated seconds, by function name (the harness's calls wrapped)."""

    def __init__(self, harness: Harness) -> None:
        self.h = harness
        self.spent: dict[str, list[float]] = {}
        names = {id(fn.get_user_function()): name for name, fn in registered().items()}
        harness.queue_fns = {q: self._timed(names[id(fn)], fn) for q, fn in harness.queue_fns.items()}
        harness.timer_fns = {t: self._timed(names[id(fn)], fn) for t, fn in harness.timer_fns.items()}
        harness.routes = [(m, template, self._timed(names[id(fn)], fn)) for m, template, fn in harness.routes]

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            start = self.h.clock()  # after the harness moved the clock to a delayed message's due time
            try:
                return fn(*args)
            finally:
                self.spent.setdefault(name, []).append(self.h.clock() - start)

        return run

    def longest(self, name: str) -> float:
        return max(self.spent.get(name, [0.0]))

    def over_bound(self) -> dict[str, float]:
        return {name: self.longest(name) for name in self.spent
                if self.longest(name) > budget.bound_s(budget.BOUNDS[name])}


@pytest.fixture
def slow_azure(azure_h: Harness, arm: FakeArm) -> Iterator[tuple[Harness, FakeArm]]:
    """The Azure harness with production's waits (lro_wait_s = LRO_WAIT_S, not the rig's short one)."""
    from shared.providers import registry
    from shared.providers.azure.compute import AzureCompute
    from shared.providers.azure.config import AzureConfig
    from tests.providers.azure.rig import endpoints

    def factory(config: Any, settings: Any) -> Any:
        assert isinstance(config, AzureConfig)
        return AzureCompute(config, settings, endpoints=endpoints(arm, lro_wait_s=budget.LRO_WAIT_S))

    undo = registry.override("azure", factory=factory)
    yield azure_h, arm
    undo()


def make_azure_slow(arm: FakeArm) -> None:
    arm.op_seconds = SLOW_OP_S
    # Reads of the run's VM throttled: answered 429 with a 10-s Retry-After, 8 times over (2 retried inline, then
    # the step re-sends itself; more would keep the launch failing until its provisioning deadline).
    arm.fail("GET", r"/virtualmachines/tensorant-", 429, "TooManyRequests", times=8, headers={"Retry-After": "10"})
    arm.fail("GET", r"/skus$", 429, "TooManyRequests", times=2, headers={"Retry-After": "10"})  # retried inline


def slow_life_of_a_run(harness: Harness, arm: FakeArm) -> tuple[str, dict[str, Any]]:
    """Connection check, catalog refresh, launch, timeout -> retain, recovery (start, stop, upload),
    verify, release; returns the run id and the run as it ends."""
    from shared.models import ConnectionMessage
    from shared.queues import get_queues
    from shared.steps import Step
    from tests.providers.azure.rig import config_body

    make_azure_slow(arm)
    harness.ok("PUT", "/api/connections/compute/azure", json_body=config_body())
    get_queues().send(Step.refresh_catalog, ConnectionMessage(org=harness.org, slot="compute:azure"))
    harness.drain()
    offers = harness.ok("GET", "/api/catalog/gpus", params={"provider": "azure"})["items"]
    offer = next(o for o in offers if o["machine_type"] == "Standard_NC24ads_A100_v4")
    run_id = harness.create_run("azure", offer["offer_id"])
    run = harness.launch(run_id)
    assert run["state"] == "provisioning" and run["resources"], (run["reason"], harness.step_errors)
    harness.agent(run_id).heartbeat("training", 0.4)
    run = harness.expire(run_id)
    assert run["state"] == "retained", (run["state"], run["reason"], harness.step_errors)
    harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    harness.ok("POST", f"/api/runs/{run_id}/stop")
    run = harness.recover(run_id, upload=trained_adapter_zip())
    return run_id, run


def test_slow_azure_flow_stays_within_every_bound(slow_azure: tuple[Harness, FakeArm]) -> None:
    h, arm = slow_azure
    timings = Timings(h)
    run_id, run = slow_life_of_a_run(h, arm)
    assert run["state"] == "succeeded", (run["state"], run["reason"], run["release_error"], h.step_errors)
    assert [r for r in arm.resources if run_id in r] == []  # VM, disk and NIC gone
    longest = {name: round(timings.longest(name), 1) for name in sorted(timings.spent)}
    print("longest invocation (simulated s):", longest)
    assert timings.over_bound() == {}, longest
    # Every cloud-touching step ran here and waited, yet under its bound ...
    for step in ("validate_connection", "refresh_catalog", "launch", "retain", "verify_adapter", "release"):
        assert timings.spent.get(step), f"{step} never ran"
        assert timings.longest(step) <= budget.invocation_bound_s(), step
    assert timings.longest("launch") >= budget.LRO_WAIT_S and timings.longest("release") >= budget.LRO_WAIT_S
    # ... and the steps that had to wait for Azure asked again with delayed messages to themselves.
    for step in ("launch", "retain", "release"):
        assert len(timings.spent[step]) >= 2, (step, timings.spent[step])
    assert max(max(v) for v in timings.spent.values()) < budget.invocation_bound_s()


def test_the_measure_catches_an_unbounded_wait(azure_h: Harness, arm: FakeArm,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits bounded per operation only by functionTimeout (300 s), with no budget: the launch runs past its bound."""
    from shared.providers import registry
    from shared.providers.azure.compute import AzureCompute
    from shared.providers.azure.config import AzureConfig
    from shared.services.steps import runner
    from tests.providers.azure.rig import endpoints

    def factory(config: Any, settings: Any) -> Any:
        assert isinstance(config, AzureConfig)
        return AzureCompute(config, settings, endpoints=endpoints(arm, lro_wait_s=300.0))

    undo = registry.override("azure", factory=factory)
    monkeypatch.setattr(runner, "step_budget_s", lambda: math.inf)
    try:
        timings = Timings(azure_h)
        arm.op_seconds = SLOW_OP_S
        offers = azure_h.ok("GET", "/api/catalog/gpus", params={"provider": "azure"})["items"]
        run_id = azure_h.create_run("azure", next(o["offer_id"] for o in offers
                                                  if o["machine_type"] == "Standard_NC24ads_A100_v4"))
        azure_h.launch(run_id)
    finally:
        undo()
    assert timings.longest("launch") > budget.invocation_bound_s()
    assert "launch" in timings.over_bound()


def test_throttling_retries_sleep_only_within_the_budget(arm: FakeArm) -> None:
    """A call throttled with a 10-s Retry-After is retried inline while the budget has room for the
    sleep, then leaves as ThrottledError (the step re-sends itself with that delay)."""
    from shared import clock
    from shared.errors import ThrottledError
    from tests.providers.azure.rig import REF, make_compute

    sim = FakeClock()
    start = sim.t
    clock.set_clock(sim)
    try:
        compute = make_compute(arm)
        arm.fail("GET", r"/virtualmachines/", 429, "TooManyRequests", times=100, headers={"Retry-After": "10"})
        with budget.within(15):
            with pytest.raises(ThrottledError) as info:
                compute.describe(REF, [])
            assert sim.t - start == 10  # one inline retry fitted, the second did not
        assert info.value.retry_after_s == 10
    finally:
        clock.set_clock(None)


def test_aws_backoff_sleeps_only_within_the_budget() -> None:
    from botocore.exceptions import ClientError
    from pydantic import SecretStr

    from shared import clock
    from shared.errors import ThrottledError
    from shared.providers.aws.client import AwsClient
    from shared.providers.aws.config import AwsConfig

    sim = FakeClock()
    clock.set_clock(sim)
    slept: list[float] = []
    try:
        # model_construct: only the fields the client reads (the launch fields are not needed here).
        config = AwsConfig.model_construct(access_key_id="AKIAEXAMPLEEXAMPLE12",  # type: ignore[call-arg]
                                           secret_access_key=SecretStr("s" * 40), session_token=None,
                                           region="us-east-1")
        client = AwsClient(config, sleep=slept.append)
        throttled = ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "DescribeInstances")

        class Ec2:
            def describe_instances(self, **_: object) -> dict[str, object]:
                raise throttled

        client._clients["ec2"] = Ec2()
        with pytest.raises(ThrottledError):
            client.call("ec2", "describe_instances")
        assert len(slept) == 3  # 4 attempts when there is time
        slept.clear()
        with budget.within(0), pytest.raises(ThrottledError):
            client.call("ec2", "describe_instances")
        assert slept == []  # none when the budget is spent: the step re-sends itself instead
    finally:
        clock.set_clock(None)
