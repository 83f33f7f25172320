"""A RunPod request its API's schema refuses, through the real function handlers (issue 27.4): the launch
step fails the run at once with RunPod's words, instead of re-sending itself until the provisioning
deadline. The fake RunPod server answers as RunPod does (HTTP 400, graphql-js's message); here it is
made to stop defining a field the pod create sends (supportPublicIp), as an API change would."""

from __future__ import annotations

import pytest

from tests.e2e.test_runpod_e2e import offer_in_volume_datacenter, runpod, runpod_h  # noqa: F401 (fixtures)
from tests.harness import Harness
from tests.providers.runpod import graphql_schema
from tests.providers.runpod.fake_server import FakeRunPod

pytestmark = pytest.mark.e2e


def test_a_launch_refused_by_runpods_schema_fails_the_run_at_once(
        runpod_h: Harness, runpod: FakeRunPod, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    run_id = runpod_h.create_run("runpod", offer_in_volume_datacenter(runpod_h))
    monkeypatch.delitem(graphql_schema.INPUT["PodFindAndDeployOnDemandInput"], "supportPublicIp")
    run = runpod_h.launch(run_id)
    assert run["state"] == "failed", (run["state"], run["reason"])
    assert 'Field "supportPublicIp" is not defined by type "PodFindAndDeployOnDemandInput"' in run["reason"]
    assert "retrying cannot" in run["reason"].lower()
    assert len(runpod.creates()) == 1 and runpod.pods == {}
