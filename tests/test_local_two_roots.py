"""Two dev hosts with different local roots on one Azurite leave each other's runs alone (issue 38.5): the
local provider's scope is its machines directory, recorded on the run at launch, so a sweep under another
root, which sees no agent of that run, does not read it as "gone from the cloud"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared import settings as settings_module
from shared.providers.base import RunRef
from shared.providers.local.compute import LocalCompute
from shared.providers.local.config import LocalConfig
from shared.settings import get_settings
from shared.store import get_store
from tests.fakes import Cloud
from tests.harness import Harness


def _as_host(monkeypatch: Any, root: Path) -> None:
    monkeypatch.setenv("TENSORANT_LOCAL_ROOT", str(root))
    settings_module.reset_settings()


def test_a_sweep_under_another_local_root_leaves_a_training_run_alone(
        harness: Harness, cloud: Cloud, env: dict[str, str], monkeypatch: Any, tmp_path: Path) -> None:
    first = Path(env["TENSORANT_LOCAL_ROOT"])
    assert harness.save_compute("local", {})["status"] == "connected"
    run_id = harness.create_run("local", "local-smoke")
    try:
        harness.launch(run_id)
        agent = harness.agent(run_id)
        agent.heartbeat("training", 0.1)
        # The second dev host: its own local root, the same Azurite (tables and queues).
        _as_host(monkeypatch, tmp_path / "second-root")
        harness.clock.advance(get_settings().sweep_grace_s + 60)
        agent.heartbeat("training", 0.2)
        harness.tick("sweeper")
        harness.drain()
        run = harness.get_run(run_id)
        # Before: "the machine is gone from the cloud (deleted outside the control plane)", retained then failed.
        assert run["state"] == "training", run["reason"]
        # Its own host still judges it: the run's agent is under the first root.
        _as_host(monkeypatch, first)
        harness.tick("sweeper")
        harness.drain()
        assert harness.get_run(run_id)["state"] == "training"
        [record] = get_store().runs.in_org(harness.org)
        assert record.scope == {"root": str(first.resolve() / "machines")}  # recorded at launch
    finally:
        _as_host(monkeypatch, first)
        LocalCompute(LocalConfig(), get_settings()).release(RunRef(get_settings().deployment_id, harness.org, run_id), [])
