"""The provider contract suite for MemoryCompute (tests/fakes.py), the in-memory cloud most flow
tests run on: a fake that breaks a promise of the real providers would let those tests pass on
behaviour no cloud has (tests/providers/contract.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from shared.models import CloudResource
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from shared.settings import Settings
from tests.fakes import OFFER, Cloud, Machine, MemoryCompute, MemoryConfig
from tests.providers.contract import Foreign, Handed, ProviderContract, ProviderEnv, check_handed


def _spec(ref: RunRef) -> LaunchSpec:
    boot = Bootstrap(container_image="ghcr.io/tensorant/trainer:2026.11",
                     env={"TENSORANT_RUN_ID": ref.run_id, "TENSORANT_API_URL": "https://cp.example.com",
                          "TENSORANT_RUN_TOKEN": "tok-contract-memory"},
                     secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"}))
    return LaunchSpec(ref=ref, offer=OFFER, bootstrap=boot)


def _handed(cloud: Cloud, ref: RunRef) -> Handed:
    [machine] = [m for m in cloud.machines.values()
                 if m.tags.get("tensorant:run") == ref.run_id and m.tags.get("tensorant:deployment") == ref.deployment
                 and m.state != "terminated"]
    return Handed(env=dict(machine.env), image=machine.image)


class TestMemoryContract(ProviderContract):
    @pytest.fixture
    def provider_env(self) -> Iterator[ProviderEnv]:
        cloud = Cloud()
        deployment = "test"

        def mine(ref: RunRef) -> list[Machine]:
            return [m for m in cloud.machines.values()
                    if m.tags.get("tensorant:run") == ref.run_id and m.tags.get("tensorant:deployment") == ref.deployment]

        def machines(ref: RunRef) -> list[str]:
            return sorted(m.id for m in mine(ref) if m.state != "terminated")

        def disks(ref: RunRef) -> list[str]:
            return sorted(m.disk_id for m in mine(ref) if m.disk_exists)

        def everything() -> dict[str, str]:
            out = {m.id: m.state for m in cloud.machines.values()}
            out.update({m.disk_id: "present" for m in cloud.machines.values() if m.disk_exists})
            return out

        def add_foreign(kind: Foreign, ref: RunRef) -> list[str]:
            tags = {"Name": ref.name}
            if kind == "other-deployment":
                tags |= RunRef(ref.deployment + "x", ref.org, ref.run_id).tags
            n = next(cloud.ids)
            cloud.machines[f"i-{n:04d}"] = Machine(id=f"i-{n:04d}", tags=tags, disk_id=f"vol-{n:04d}")
            return [f"i-{n:04d}", f"vol-{n:04d}"]

        @contextmanager
        def slow_release() -> Iterator[None]:
            cloud.hold_deletes = True
            try:
                yield
            finally:
                cloud.hold_deletes = False

        yield ProviderEnv(
            provider=MemoryCompute(MemoryConfig(), Settings(deployment_id=deployment), cloud),
            ref=RunRef(deployment, "org-1", "run-c1"), spec=_spec, machines=machines, disks=disks,
            everything=everything, add_foreign=add_foreign, page_size=1, handed=lambda ref: _handed(cloud, ref),
            list_requests=None,  # one in-process dict, read whole
            slow_release=slow_release)


class _DropsTheEnvironment(MemoryCompute):
    """A throwaway provider that creates the machine without the agent's environment."""

    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        return super().launch(dataclasses.replace(spec, bootstrap=Bootstrap(spec.bootstrap.container_image, {})))


class _RunsAnotherImage(MemoryCompute):
    def launch(self, spec: LaunchSpec) -> list[CloudResource]:
        return super().launch(dataclasses.replace(
            spec, bootstrap=dataclasses.replace(spec.bootstrap, container_image="busybox")))


@pytest.mark.parametrize(("compute", "caught"), [(_DropsTheEnvironment, "lacks or changes"),
                                                  (_RunsAnotherImage, "runs 'busybox'")])
def test_the_contract_fails_a_provider_that_drops_the_bootstrap(compute: type[MemoryCompute], caught: str) -> None:
    cloud = Cloud()
    ref = RunRef("test", "org-1", "run-drop")
    spec = _spec(ref)
    compute(MemoryConfig(), Settings(deployment_id="test"), cloud).launch(spec)
    with pytest.raises(AssertionError, match=caught):
        check_handed(_handed(cloud, ref), spec)
