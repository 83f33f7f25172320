"""The machine's bootstrap, executed: each cloud's launch, then tests/machine.py plays the machine.

AWS (moto), Azure (fake ARM) and RunPod (fake GraphQL) launch through the real function app;
the user data moto and the fake ARM received (or the pod request the fake RunPod received) is
run for real: cloud-init's schema check, the files written, the script run by bash, `docker
run` starting the image's ENTRYPOINT (the agent, with the smoke trainer the operator setting
names) against the control plane's HTTP host. Storage is custom S3 (moto) through presigned
URLs, as on a customer's machine. Time is simulated: the `sleep` shim's seconds move the clock.

Each failed start is driven the same way (pull fails, container start fails, agent exits at
start, machine never reports) and must end failed and released, within the boot deadline,
with the GPU time it cost measured in simulated seconds.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from shared.providers import cloudinit
from shared.settings import get_settings
from tests.e2e.boot import BootHarness, finish
from tests.harness import Harness
from tests.machine import Machine, wait_for
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.runpod.fake_server import FakeRunPod

pytestmark = pytest.mark.e2e



# ---------------------------------------------------------------- AWS (boot_aws_h: tests/e2e/conftest.py)

def _aws_launch(harness: Harness, ec2: Any) -> tuple[str, str, str]:
    offer = next(o for o in harness.ok("GET", "/api/catalog/gpus", params={"provider": "aws"})["items"]
                 if o["machine_type"] == "g6.xlarge")
    run_id = harness.create_run("aws", offer["offer_id"], runtime_limit_s=7200)
    run = harness.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], harness.step_errors)
    instance = next(r["id"] for r in run["resources"] if r["kind"] == "instance")
    raw = ec2.describe_instance_attribute(InstanceId=instance, Attribute="userData")["UserData"]["Value"]
    return run_id, instance, base64.b64decode(raw).decode()


def _state(ec2: Any, instance: str) -> str:
    return str(ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]["Name"])


def test_aws_user_data_runs_the_agent_to_succeeded(boot_aws_h: tuple[BootHarness, Any], tmp_path: Path) -> None:
    h, ec2 = boot_aws_h
    run_id, instance, user_data = _aws_launch(h, ec2)
    machine = Machine(tmp_path / "vm", h.clock)
    machine.boot(user_data)
    run = finish(h, run_id, machine)
    assert run["state"] == "succeeded", f"{run['reason']}\n{h.step_errors}\n{machine.console()[-3000:]}"
    assert _state(ec2, instance) == "terminated"
    calls = machine.docker_calls()
    assert [c[0] for c in calls] == ["pull", "rm", "run"], calls
    assert calls[0][1] == get_settings().container_image
    assert "--gpus" in calls[2] and "/workspace/data" in calls[2][-2]
    # The agent ran from the image's entrypoint with the run's data on the machine's data disk.
    data = machine.path(cloudinit.HOST_DATA_DIR)
    assert (data / "adapter.zip").is_file() and (data / "agent-state.json").is_file()
    assert "agent: adapter uploaded" in machine.console()
    assert "tensorant-train: the training container exited" not in machine.console()  # it idles until deleted
    assert run["billed_machine_s"] < 120  # the smoke trainer's seconds, not a deadline


def test_aws_pull_retried_with_backoff_then_succeeds(boot_aws_h: tuple[BootHarness, Any], tmp_path: Path) -> None:
    h, ec2 = boot_aws_h
    run_id, _, user_data = _aws_launch(h, ec2)
    machine = Machine(tmp_path / "vm", h.clock, pull_fails="2")
    machine.boot(user_data)
    run = finish(h, run_id, machine)
    assert run["state"] == "succeeded", (run["reason"], machine.console()[-3000:])
    assert [c[0] for c in machine.docker_calls()].count("pull") == 3
    assert h.clock.slept() == cloudinit.PULL_FIRST_DELAY_S * 3  # 15 s, then 30 s


@pytest.mark.parametrize(("shim", "stage", "words"), [
    ({"pull_fails": "all"}, "could not pull the training image", ["after 4 attempts", "denied"]),
    ({"run": "no-gpu"}, "could not start the training container", ["exit code 125", "could not select device driver"]),
    ({"run": "no-agent"}, "agent exited before it reported", ["exit code 1", "No module named"]),
], ids=["pull-fails", "no-nvidia-runtime", "agent-exits-at-start"])
def test_aws_failed_start_is_reported_and_released_within_minutes(boot_aws_h: tuple[BootHarness, Any], tmp_path: Path,
                                                                  shim: dict[str, str], stage: str,
                                                                  words: list[str]) -> None:
    h, ec2 = boot_aws_h
    run_id, instance, user_data = _aws_launch(h, ec2)
    machine = Machine(tmp_path / "vm", h.clock, **shim)
    machine.boot(user_data)
    wait_for(lambda: machine.exited() is not None, "the bootstrap script to end", machine=machine)
    run = finish(h, run_id, machine)
    assert run["state"] == "failed", f"{run['reason']}\n{h.step_errors}\n{machine.console()[-3000:]}"
    assert stage in run["reason"] and "released" in run["reason"], run["reason"]
    for word in words:
        assert word in run["reason"], run["reason"]
    assert "the cloud says: " in run["reason"], run["reason"]  # EC2's own account, read before the delete
    assert _state(ec2, instance) == "terminated"
    # GPU time billed for the failed start, in simulated seconds: the pull retries' backoff and the
    # release's confirmation at most (a real machine adds its boot, which nothing here simulates).
    assert run["billed_machine_s"] <= 15 + 30 + 60 + 30, run["billed_machine_s"]
    print(f"\n{stage}: billed {run['billed_machine_s']:.0f} simulated s")


def test_aws_machine_that_never_reports_is_released_at_its_first_report_deadline(boot_aws_h: tuple[BootHarness, Any]) -> None:
    h, ec2 = boot_aws_h
    from shared.providers.cloudinit import FIRST_REPORT_S

    run_id, instance, _ = _aws_launch(h, ec2)  # the machine never runs its user data
    # Released at its first-report deadline (the claim never exchanged), not the whole boot deadline.
    deadline = FIRST_REPORT_S
    assert deadline < get_settings().provisioning_timeout_s
    h.serve(deadline + 1)  # the control plane serving all along: heartbeat-check ticks every minute
    run = finish(h, run_id, None)
    assert run["state"] == "failed" and "never reached the control plane" in run["reason"], run["reason"]
    assert _state(ec2, instance) == "terminated"
    assert deadline <= run["billed_machine_s"] <= deadline + 60, run["billed_machine_s"]
    print(f"\nno report (AWS): billed {run['billed_machine_s']:.0f} simulated s")


def test_a_late_boot_report_does_not_end_a_running_run(boot_aws_h: tuple[BootHarness, Any]) -> None:
    h, ec2 = boot_aws_h
    run_id, _, _ = _aws_launch(h, ec2)
    agent = h.agent(run_id)
    agent.heartbeat("training", 0.3)
    out = h.ok("POST", f"/api/agent/runs/{run_id}/boot-failed", token=agent.token,
               json_body={"stage": "agent", "exit_code": 1, "last_lines": ["boom"]})
    assert out == {"state": "training"}
    run = h.get_run(run_id)
    assert run["state"] == "training"
    assert any("after the agent had reported" in e["message"] for e in run["events"])
    status, body, _ = h.call("POST", f"/api/agent/runs/{run_id}/boot-failed", token="member",
                             json_body={"stage": "agent", "exit_code": 1})
    assert status == 403, body  # a user's token is not the run's


# ---------------------------------------------------------------- Azure

def _azure_launch(harness: Harness, arm: FakeArm) -> tuple[str, str, str]:
    offer = next(o for o in harness.ok("GET", "/api/catalog/gpus", params={"provider": "azure"})["items"]
                 if o["machine_type"] == "Standard_NC24ads_A100_v4")
    run_id = harness.create_run("azure", offer["offer_id"], runtime_limit_s=7200)
    run = harness.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], harness.step_errors)
    vm = next(r["id"] for r in run["resources"] if r["kind"] == "vm")
    return run_id, vm, base64.b64decode(arm.get(vm)["_custom_data"]).decode()  # type: ignore[index]


def test_azure_custom_data_runs_the_agent_to_succeeded(boot_azure_h: BootHarness, arm: FakeArm, tmp_path: Path) -> None:
    run_id, vm, user_data = _azure_launch(boot_azure_h, arm)
    machine = Machine(tmp_path / "vm", boot_azure_h.clock)
    machine.boot(user_data)
    run = finish(boot_azure_h, run_id, machine)
    assert run["state"] == "succeeded", f"{run['reason']}\n{boot_azure_h.step_errors}\n{machine.console()[-3000:]}"
    assert arm.get(vm) is None


def test_azure_failed_pull_is_released_with_the_clouds_account(boot_azure_h: BootHarness, arm: FakeArm,
                                                                tmp_path: Path) -> None:
    run_id, vm, user_data = _azure_launch(boot_azure_h, arm)
    machine = Machine(tmp_path / "vm", boot_azure_h.clock, pull_fails="all")
    machine.boot(user_data)
    run = finish(boot_azure_h, run_id, machine)
    assert run["state"] == "failed" and "could not pull the training image" in run["reason"], run["reason"]
    assert "the cloud says: " in run["reason"], run["reason"]
    assert arm.get(vm) is None
    assert run["billed_machine_s"] <= 15 + 30 + 60 + 30, run["billed_machine_s"]
    print(f"\npull fails (Azure): billed {run['billed_machine_s']:.0f} simulated s")


# ---------------------------------------------------------------- RunPod

def _runpod_launch(harness: Harness) -> str:
    offer = next(o for o in harness.ok("GET", "/api/catalog/gpus", params={"provider": "runpod"})["items"]
                 if o["machine_type"] == "NVIDIA A40")
    run_id = harness.create_run("runpod", offer["offer_id"], runtime_limit_s=7200, price_limit=10.0)
    run = harness.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], harness.step_errors)
    return run_id


def test_runpod_pod_request_runs_the_agent_to_succeeded(boot_runpod_h: tuple[BootHarness, FakeRunPod], tmp_path: Path) -> None:
    h, fake_rp = boot_runpod_h
    run_id = _runpod_launch(h)
    pod_input = fake_rp.creates()[0]["variables"]["input"]
    machine = Machine(tmp_path / "pod", h.clock)
    machine.start_pod(pod_input)
    run = finish(h, run_id, machine)
    assert run["state"] == "succeeded", f"{run['reason']}\n{h.step_errors}\n{machine.console()[-3000:]}"
    [call] = machine.docker_calls()
    assert call[-1] == get_settings().container_image and call[-2].endswith(":/workspace")
    assert (machine.root / "fs/runpod-volume/data/adapter.zip").is_file()  # the pod's volume: /workspace/data


def test_runpod_pod_that_never_reports_is_released_at_the_boot_deadline(boot_runpod_h: tuple[BootHarness, FakeRunPod]) -> None:
    h, _ = boot_runpod_h
    run_id = _runpod_launch(h)  # the pod sits pulling
    deadline = get_settings().provisioning_timeout_s
    h.serve(deadline + 1)  # the control plane serving all along: heartbeat-check ticks every minute
    run = finish(h, run_id, None)
    assert run["state"] == "failed" and "boot deadline" in run["reason"], run["reason"]
    assert "the cloud says: " in run["reason"], run["reason"]
    assert deadline <= run["billed_machine_s"] <= deadline + 60, run["billed_machine_s"]
    print(f"\nno report (RunPod): billed {run['billed_machine_s']:.0f} simulated s")
