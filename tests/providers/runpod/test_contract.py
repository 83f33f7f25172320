"""The provider contract suite for RunPod, on the fake GraphQL server (tests/providers/contract.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from shared.models import GpuOffer
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from shared.providers.runpod.compute import RunPodCompute, is_run_pod
from shared.providers.runpod.config import RunPodConfig
from shared.settings import Settings
from tests.providers.contract import CloudContract, Foreign, Handed, ProviderEnv
from tests.providers.runpod.fake_server import FakeRunPod

KEY = "rpa_TESTKEY0123456789"
OFFER = GpuOffer(provider="runpod", offer_id="x", gpu="NVIDIA A40", gpu_memory_gb=48, machine_type="NVIDIA A40",
                 region="any", compute_per_hour=0.4, disk_per_hour=0.01, total_per_hour=0.41)


class TestRunPodContract(CloudContract):
    @pytest.fixture
    def provider_env(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderEnv]:
        fake = FakeRunPod(api_key=KEY).start()
        monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)

        def spec(ref: RunRef) -> LaunchSpec:
            boot = Bootstrap(container_image="ghcr.io/tensorant/trainer:2026.11",
                             env={"TENSORANT_RUN_ID": ref.run_id, "TENSORANT_API_URL": "https://cp.example.com",
                                  "TENSORANT_RUN_TOKEN": "tok-contract-runpod"},
                             secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"}))
            return LaunchSpec(ref=ref, offer=OFFER, bootstrap=boot)

        def machines(ref: RunRef) -> list[str]:
            return sorted(pid for pid, pod in fake.pods.items() if is_run_pod(pod["name"], ref))

        def add_foreign(kind: Foreign, ref: RunRef) -> list[str]:
            # RunPod has no tags: the name is the mark.
            name = (f"notebook-{ref.run_id}" if kind == "unmarked"
                    else RunRef(ref.deployment + "x", ref.org, ref.run_id).name)
            return [fake.add_pod(name)]

        def handed(ref: RunRef) -> Handed:
            # The pod's env and image as the fake server recorded them from podFindAndDeployOnDemand.
            [pod] = [fake.pods[pid] for pid in machines(ref)]
            return Handed(env={e["key"]: e["value"] for e in pod["env"]}, image=str(pod["imageName"]))

        @contextmanager
        def slow_release() -> Iterator[None]:
            fake.terminate_lag = 2  # a terminated pod is still returned by the next reads
            try:
                yield
            finally:
                fake.terminate_lag = 0

        @contextmanager
        def refuse(kind: str, code: str) -> Iterator[None]:
            # RunPod's table holds GraphQL error messages, and HTTP statuses written "HTTP <status>".
            status = int(code.removeprefix("HTTP ")) if code.startswith("HTTP ") else 0
            fake.http_status, fake.refuse_all = status, "" if status else code
            try:
                yield
            finally:
                fake.http_status, fake.refuse_all = 0, ""

        provider = RunPodCompute(RunPodConfig(api_key=KEY), Settings(deployment_id="test"))  # type: ignore[arg-type]
        try:
            yield ProviderEnv(
                provider=provider, ref=RunRef("test", "org-1", "run-c1"), spec=spec, machines=machines,
                disks=machines,  # the pod volume at /workspace lives and dies with the pod
                everything=lambda: {pid: str(pod["desiredStatus"]) for pid, pod in fake.pods.items()},
                add_foreign=add_foreign, page_size=2, handed=handed,
                list_requests=None,  # myself.pods answers every pod at once
                slow_release=slow_release, refuse=refuse)
        finally:
            fake.stop()
