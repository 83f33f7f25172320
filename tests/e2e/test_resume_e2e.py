"""Resume and self-protection on every cloud, through the machine harness (issue 29.3, issue 33.3).

Each cloud's launch goes through the real function app (AWS on moto, Azure on the fake ARM, RunPod on
the fake RunPod server); tests/machine.py plays the machine from what the cloud received, and the agent
runs the smoke trainer in its checkpoint mode (machine/trainer/smoke.py): a checkpoint every 2 steps of 6,
held after step 4 (a run long enough to be stopped there), continued from the checkpoint when resumed.

- Resume: the runtime limit passes mid-training (the simulated clock, heartbeat-check ticking), the run
  is retained and the cloud stops the machine, keeping its disk; `recover --resume` starts it again, the
  agent on the kept disk trains on from step 4 to 6 and the run ends succeeded with one final adapter.
- Self-protection: the control plane goes away under a training agent; past TENSORANT_UNREACHABLE_STOP_S
  (2 s here) the agent stops training, its checkpoint's adapter is in storage, and the machine powers
  itself off with its disk kept: on AWS and Azure the agent exits 80 and the host script runs
  `poweroff`; on RunPod the pod stops itself through podStop. The control plane then comes back, retains
  the silent run, and `recover --resume` takes it to succeeded the same way. On AWS also past the run's
  deadline plus the margin, with the control plane serving.
"""

from __future__ import annotations

import base64
import io
import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shared.providers import cloudinit
from shared.settings import get_settings
from tests.e2e.boot import END, RUNPOD_KEY, BootHarness, finish
from tests.machine import Machine, wait_for
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.runpod.fake_server import FakeRunPod

pytestmark = pytest.mark.e2e

STEPS, HOLD = 6, 4
# What the image's ENV would carry in these tests (tests/docker_shim.py SHIM_AGENT_ENV): the smoke trainer's
# checkpoint mode, and heartbeats every second (a resumed agent asks every interval whether to go on).
TRAINER_ENV = {"TENSORANT_SMOKE_STEPS": str(STEPS), "TENSORANT_SMOKE_STEP_SECONDS": "0.05",
               "TENSORANT_SMOKE_CHECKPOINT_EVERY": "2", "TENSORANT_SMOKE_HOLD_AT": str(HOLD),
               "TENSORANT_HEARTBEAT_INTERVAL_S": "1"}
UNREACHABLE_S = 2
STOPPED_EXTRA_S = 3600  # a retained machine stays stopped this long past its agent's token's expiry
# Real seconds from launch to the deadline's self-stop: the checkpoint comes in about 3 (15 failed once at load 10).
DEADLINE_IN_S = 30


def machine_for(root: Path, h: BootHarness, **extra: str) -> Machine:
    return Machine(root, h.clock, agent_env=json.dumps({**TRAINER_ENV, **extra}))


def launch(h: BootHarness, provider: str, machine_type: str, runtime_limit_s: int) -> tuple[str, dict[str, Any]]:
    offer = next(o for o in h.ok("GET", "/api/catalog/gpus", params={"provider": provider})["items"]
                 if o["machine_type"] == machine_type)
    run_id = h.create_run(provider, offer["offer_id"], runtime_limit_s=runtime_limit_s, price_limit=10.0)
    run = h.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], h.step_errors)
    return run_id, run


def logs(h: BootHarness, run_id: str) -> list[str]:
    return list(h.ok("GET", f"/api/runs/{run_id}/logs")["lines"])


def await_checkpoint(h: BootHarness, run_id: str, machine: Machine) -> None:
    """Until the agent uploaded the checkpoint at step HOLD and the trainer holds there."""
    def held() -> bool:
        lines = logs(h, run_id)
        return (any(f"checkpoint adapter uploaded (step-{HOLD:06d}" in line for line in lines)
                and any(f"holding at step {HOLD}" in line for line in lines))

    wait_for(held, "the checkpoint at the held step to be uploaded", 90, machine=machine, between=h.drain)


def booted_to_checkpoint(h: BootHarness, run_id: str, user_data: str, root: Path,
                         **extra: str) -> tuple[Machine, Path]:
    """A cloud-init machine booted with the launch's user data, trained to the checkpoint its trainer holds at;
    the machine and its data directory."""
    machine = machine_for(root, h, **extra)
    machine.boot(user_data)
    await_checkpoint(h, run_id, machine)
    return machine, machine.path(cloudinit.HOST_DATA_DIR)


def stored_manifest(run_id: str) -> dict[str, Any]:
    """The manifest of the run's adapter archive in the org's storage (custom S3 on moto)."""
    from shared.context import invocation
    from shared.org_storage.base import adapter_key
    from shared.runs.org_backends import storage_for

    with storage_for(invocation(), "org-a").open_stream(adapter_key(run_id), 64 << 20) as stream:
        data = stream.read()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        manifest: dict[str, Any] = json.loads(z.read("manifest.json"))
    return manifest


def agent_state(data_dir: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((data_dir / "agent-state.json").read_text())
    return state


def retain_at_runtime_limit(h: BootHarness, run_id: str, machine: Machine, data_dir: Path) -> dict[str, Any]:
    """The runtime limit passes with the control plane serving (heartbeat-check every minute): the run is
    retained, the agent hears stop and records it (its checkpoint on the disk), and the cloud stops the
    machine (played here: everything on it ends; the disk stays)."""
    run = h.get_run(run_id)
    h.serve(run["runtime_limit_s"] + 61)
    run = wait_for(lambda: (r := h.get_run(run_id))["state"] == "retained" and r, "the run to be retained", 60,
                   machine=machine, between=h.drain)
    assert "runtime limit" in run["reason"], run["reason"]
    wait_for(lambda: agent_state(data_dir).get("stopped"), "the agent to record its stop", 60, machine=machine)
    machine.power_off()
    # Stopped for longer than any token the agent holds lives (the launch's covers the image pull too): the agent
    # comes back with an expired one and exchanges it once for a fresh one (POST .../restart).
    settings = get_settings()
    h.clock.advance(settings.provisioning_timeout_s + settings.agent_token_ttl_s + STOPPED_EXTRA_S)
    return dict(run)


def resume_to_succeeded(h: BootHarness, run_id: str, machine: Machine, data_dir: Path, *,
                        expired: bool = True, exchanged_while_retained: bool = False) -> dict[str, Any]:
    """What every cloud's resume ends in: trained on from the held checkpoint to the planned steps, once, and
    succeeded with one final adapter. `expired`: the machine was stopped longer than its agent's token lives
    (retain_at_runtime_limit), so the agent exchanged it once; else it needed no exchange.
    `exchanged_while_retained`: the exchange came at a recover --start, while the run stored no log lines, so
    only its event says so (the caller read the agent's own log on the disk)."""
    run = finish(h, run_id, machine)
    lines = logs(h, run_id)
    assert run["state"] == "succeeded", f"{run['reason']}\n{h.step_errors}\n{machine.console()[-3000:]}"
    assert run["adapter_kind"] == "final", run
    walked = [e["message"].split(":")[0] for e in run["events"] if e["kind"] == "transition"]
    # As a set: events written at one simulated instant do not keep their order.
    assert {"retaining -> retained", "retained -> training", "releasing -> succeeded"} <= set(walked), walked
    assert any(f"resuming from step-{HOLD:06d} (step {HOLD} of {STEPS})" in line for line in lines), lines[-30:]
    # The token it came back with had expired while the machine was stopped: exchanged once, for this start.
    if not exchanged_while_retained:
        assert any("the token was exchanged for a fresh one" in line for line in lines) == expired, lines[-30:]
    assert [e["kind"] for e in run["events"] if "exchanged its expired token" in e["message"]] == ["audit"] * expired
    assert not any("restart of the machine was refused" in e["message"] for e in run["events"])
    trained = [line.split()[1] for line in lines if line.startswith("progress=")]
    assert trained == [f"step={k}" for k in range(1, STEPS + 1)], trained  # every step once, across the stop
    manifest = stored_manifest(run_id)
    assert "checkpoint_step" not in manifest and manifest["resumed_from_step"] == HOLD, manifest
    assert manifest["steps"] == STEPS
    with zipfile.ZipFile(data_dir / "adapter.zip") as z:  # the same adapter, exported on the kept disk
        assert json.loads(z.read("manifest.json")) == manifest
    return run


def restart(plane: Any) -> Any:
    """The control plane back after its outage: the same routes on the same address (plane is stopped)."""
    import function_app
    from tensorant_devhost.host import Host
    from tests.e2e.local_host import ROOT

    return Host(function_app.app, root=ROOT, port=plane.port, load_settings=False, queues=False,
                timers=False).start()


@contextmanager
def back_and_retained(h: BootHarness, plane: Any, run_id: str) -> Iterator[None]:
    """The control plane back after its outage: heartbeat-check, serving again, reads the agent's silence
    and retains the run (its checkpoint is in storage), ready for `recover --resume`."""
    back = restart(plane)
    try:
        h.serve(get_settings().heartbeat_timeout_s + 120)
        run = wait_for(lambda: (r := h.get_run(run_id))["state"] in END and r, "the run to be retained", 60,
                       between=h.drain)
        assert run["state"] == "retained", (run["reason"], h.step_errors)
        yield
    finally:
        back.stop()


def assert_self_stopped_with_checkpoint(run_id: str, data_dir: Path) -> None:
    state = agent_state(data_dir)
    assert "unreachable" in state["self_stopped"] and state["stopped"], state
    assert (data_dir / "checkpoint" / f"step-{HOLD:06d}" / "manifest.json").is_file()  # kept on the disk
    manifest = stored_manifest(run_id)  # and its adapter in storage, for recover --verify-saved
    assert (manifest["checkpoint_step"], manifest["steps"]) == (HOLD, STEPS), manifest


def assert_powered_off_by_the_host_script(machine: Machine) -> None:
    """AWS and Azure: the agent exits 80 and cloud-init's script runs `poweroff` (the shim records it)."""
    wait_for(lambda: machine.exited() is not None, "the machine's script to power it off", 90, machine=machine)
    console = machine.console()
    assert f"the training container exited with code {cloudinit.POWEROFF_EXIT}" in console, console[-3000:]
    assert "the agent stopped by itself and asked for a poweroff; the disk is kept" in console
    assert machine.powered_off_by_guest() and machine.exited() == 0


def test_smoke_checkpoint_mode_writes_the_real_trainers_layout_and_resumes(tmp_path: Path) -> None:
    """The mode the tests below run: step-<k> folders whole (older ones removed), a manifest saying
    checkpoint_step of steps, the hold, and a resume that trains only the steps after the checkpoint."""
    import os
    import subprocess
    import sys

    from machine.agent.trainer import newest_checkpoint

    env = {**os.environ, **TRAINER_ENV, "TENSORANT_SMOKE_STEP_SECONDS": "0", "TENSORANT_OUTPUT_DIR": str(tmp_path / "out"),
           "TENSORANT_BASE_MODEL": "tensorant/smoke-tiny", "TENSORANT_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    command = [sys.executable, "-m", "machine.trainer.smoke"]
    held = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert held.stdout is not None
    lines = []
    for line in held.stdout:
        lines.append(line.strip())
        if "holding at step" in line:
            break
    held.kill()
    held.wait()
    assert [x.split(" dir=")[0] for x in lines if x.startswith("checkpoint")] == ["checkpoint step=2", "checkpoint step=4"]
    folder = newest_checkpoint(tmp_path / "ckpt")
    assert folder is not None and folder.name == f"step-{HOLD:06d}"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [folder.name]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (manifest["checkpoint_step"], manifest["steps"]) == (HOLD, STEPS)
    assert not (tmp_path / "out" / "manifest.json").exists()

    resumed = subprocess.run(command, env={**env, "TENSORANT_RESUME_FROM": str(folder)}, capture_output=True,
                             text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    trained = [x.split()[1] for x in resumed.stdout.splitlines() if x.startswith("progress=")]
    assert trained == [f"step={k}" for k in range(HOLD + 1, STEPS + 1)], resumed.stdout
    final = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert final["resumed_from_step"] == HOLD and "checkpoint_step" not in final


# ---------------------------------------------------------------- AWS (boot_aws_h: tests/e2e/conftest.py)

def _aws_launch(h: BootHarness, ec2: Any, runtime_limit_s: int) -> tuple[str, str, str]:
    run_id, run = launch(h, "aws", "g6.xlarge", runtime_limit_s)
    instance = next(r["id"] for r in run["resources"] if r["kind"] == "instance")
    raw = ec2.describe_instance_attribute(InstanceId=instance, Attribute="userData")["UserData"]["Value"]
    return run_id, instance, base64.b64decode(raw).decode()


def _ec2_state(ec2: Any, instance: str) -> str:
    return str(ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]["Name"])


def _volumes(ec2: Any, instance: str) -> list[str]:
    found = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [instance]}])["Volumes"]
    return [v["VolumeId"] for v in found]


def test_aws_resume_continues_from_the_checkpoint_on_the_kept_disk(boot_aws_h: tuple[BootHarness, Any],
                                                                   tmp_path: Path) -> None:
    h, ec2 = boot_aws_h
    run_id, instance, user_data = _aws_launch(h, ec2, runtime_limit_s=60)
    machine, data = booted_to_checkpoint(h, run_id, user_data, tmp_path / "vm")
    retain_at_runtime_limit(h, run_id, machine, data)
    assert _ec2_state(ec2, instance) == "stopped" and _volumes(ec2, instance)  # the disk kept

    run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    h.drain()
    assert run["state"] == "training" and _ec2_state(ec2, instance) == "running", (run, h.step_errors)
    machine.boot_again()  # the instance boots again: its enabled unit starts the container on the kept disk
    resume_to_succeeded(h, run_id, machine, data)
    assert _ec2_state(ec2, instance) == "terminated"
    assert [c[0] for c in machine.docker_calls()].count("run") == 2


def test_aws_start_for_recovery_after_the_token_expired_then_resume(boot_aws_h: tuple[BootHarness, Any],
                                                                   tmp_path: Path) -> None:
    """`recover --start` hours after the retain: the instance boots again, the agent on the kept disk exchanges its
    expired token (once), finds its stop and its checkpoint and waits, heard; `recover --resume` (a new start: its
    exchanged token still lives, so no second exchange) trains on to succeeded."""
    h, ec2 = boot_aws_h
    run_id, instance, user_data = _aws_launch(h, ec2, runtime_limit_s=60)
    machine, data = booted_to_checkpoint(h, run_id, user_data, tmp_path / "vm")
    retain_at_runtime_limit(h, run_id, machine, data)

    run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    assert run["state"] == "retained" and _ec2_state(ec2, instance) == "running", run
    machine.boot_again()
    wait_for(lambda: any("exchanged its expired token" in e["message"] for e in h.get_run(run_id)["events"]),
             "the agent to exchange its expired token", 60, machine=machine, between=h.drain)
    # The agent's own log on the disk (a retained run stores no lines): it waits, heard with its fresh token.
    wait_for(lambda: "waiting for a resume" in (data / "logs.txt").read_text(), "the agent to wait for a resume", 60,
             machine=machine, between=h.drain)
    since = (data / "logs.txt").read_text().split("the token was exchanged for a fresh one", 1)
    assert len(since) == 2 and "HTTP 401" not in since[1], since[-1][-2000:]

    run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    h.drain()
    assert run["state"] == "training", (run, h.step_errors)
    resume_to_succeeded(h, run_id, machine, data, exchanged_while_retained=True)
    assert [c[0] for c in machine.docker_calls()].count("run") == 2


def test_aws_agent_powers_off_when_the_control_plane_is_gone(boot_aws_h: tuple[BootHarness, Any], plane: Any,
                                                              tmp_path: Path) -> None:
    h, ec2 = boot_aws_h
    run_id, instance, user_data = _aws_launch(h, ec2, runtime_limit_s=7200)
    machine, data = booted_to_checkpoint(h, run_id, user_data, tmp_path / "vm", TENSORANT_UNREACHABLE_STOP_S=str(UNREACHABLE_S))
    plane.stop()  # the control plane is gone; storage (S3) is still there
    assert_powered_off_by_the_host_script(machine)
    assert_self_stopped_with_checkpoint(run_id, data)
    # What the guest's poweroff does on EC2: the instance was launched to stop (not terminate) on it.
    behavior = ec2.describe_instance_attribute(InstanceId=instance, Attribute="instanceInitiatedShutdownBehavior")
    assert behavior["InstanceInitiatedShutdownBehavior"]["Value"] == "stop"
    ec2.stop_instances(InstanceIds=[instance])  # played: moto does not run the guest
    assert _ec2_state(ec2, instance) == "stopped" and _volumes(ec2, instance)

    # The control plane comes back: heartbeat-check reads the silence and retains the run (its checkpoint is in
    # storage); `recover --resume` starts the instance and the agent trains on from the checkpoint.
    with back_and_retained(h, plane, run_id):
        run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
        h.drain()
        assert run["state"] == "training" and _ec2_state(ec2, instance) == "running", (run, h.step_errors)
        machine.boot_again()
        resume_to_succeeded(h, run_id, machine, data, expired=False)  # stopped for minutes: its token still lives


def test_aws_agent_powers_off_past_its_deadline_and_margin(boot_aws_h: tuple[BootHarness, Any],
                                                            tmp_path: Path) -> None:
    """The control plane serving but never stopping the machine: the agent compares the run's deadline at
    launch (simulated time, in its bootstrap) with its own wall clock. The simulated clock is set back so that
    the deadline plus the margin (1 s here) falls DEADLINE_IN_S of real time after the launch, past the
    checkpoint the trainer holds at."""
    import time

    h, ec2 = boot_aws_h
    limit, margin = 60, 1
    h.clock.t = time.time() - limit - margin + DEADLINE_IN_S
    run_id, instance, user_data = _aws_launch(h, ec2, runtime_limit_s=limit)
    machine, data = booted_to_checkpoint(h, run_id, user_data, tmp_path / "vm", TENSORANT_SELF_STOP_MARGIN_S=str(margin))
    assert machine.exited() is None, "the deadline passed before the checkpoint: raise DEADLINE_IN_S"
    assert_powered_off_by_the_host_script(machine)
    state = agent_state(data)
    assert "the run's deadline and a margin of 1 s have passed" in state["self_stopped"], state
    assert (stored_manifest(run_id)["checkpoint_step"], h.get_run(run_id)["state"]) == (HOLD, "training")
    behavior = ec2.describe_instance_attribute(InstanceId=instance, Attribute="instanceInitiatedShutdownBehavior")
    assert behavior["InstanceInitiatedShutdownBehavior"]["Value"] == "stop" and _volumes(ec2, instance)


# ---------------------------------------------------------------- Azure

def _azure_launch(h: BootHarness, arm: FakeArm, runtime_limit_s: int) -> tuple[str, dict[str, Any], str]:
    run_id, run = launch(h, "azure", "Standard_NC24ads_A100_v4", runtime_limit_s)
    vm = next(r["id"] for r in run["resources"] if r["kind"] == "vm")
    return run_id, run, base64.b64decode(arm.get(vm)["_custom_data"]).decode()  # type: ignore[index]


def _arm_resources(arm: FakeArm, run: dict[str, Any]) -> dict[str, Any]:
    return {r["kind"]: arm.get(r["id"]) for r in run["resources"]}


def test_azure_resume_continues_from_the_checkpoint_on_the_kept_disk(boot_azure_h: BootHarness, arm: FakeArm,
                                                                     tmp_path: Path) -> None:
    h = boot_azure_h
    run_id, launched, user_data = _azure_launch(h, arm, runtime_limit_s=60)
    machine, data = booted_to_checkpoint(h, run_id, user_data, tmp_path / "vm")
    retain_at_runtime_limit(h, run_id, machine, data)
    kept = _arm_resources(arm, launched)
    assert all(found is not None for found in kept.values()), kept  # the VM and its disk kept
    assert kept["vm"]["_state"]["power"] == "deallocated", kept["vm"]["_state"]  # its compute no longer billed

    run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    h.drain()
    assert run["state"] == "training", (run, h.step_errors)
    assert kept["vm"]["_state"]["power"] == "running", kept["vm"]["_state"]
    machine.boot_again()
    resume_to_succeeded(h, run_id, machine, data)
    assert all(arm.get(r["id"]) is None for r in launched["resources"] if r["kind"] == "vm")


def test_azure_agent_powers_off_when_the_control_plane_is_gone(boot_azure_h: BootHarness, arm: FakeArm, plane: Any,
                                                                tmp_path: Path) -> None:
    h = boot_azure_h
    run_id, launched, user_data = _azure_launch(h, arm, runtime_limit_s=7200)
    machine, data = booted_to_checkpoint(h, run_id, user_data, tmp_path / "vm", TENSORANT_UNREACHABLE_STOP_S=str(UNREACHABLE_S))
    plane.stop()
    assert_powered_off_by_the_host_script(machine)
    assert_self_stopped_with_checkpoint(run_id, data)
    kept = _arm_resources(arm, launched)
    assert all(found is not None for found in kept.values()), kept  # nothing deleted: VM, disk, NIC
    kept["vm"]["_state"] = {"power": "stopped"}  # played: a guest poweroff leaves the VM stopped, still allocated

    # Back: the retain deallocates the VM (its compute billing ends there), the resume starts it again.
    with back_and_retained(h, plane, run_id):
        assert kept["vm"]["_state"]["power"] == "deallocated", kept["vm"]["_state"]
        run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
        h.drain()
        assert run["state"] == "training", (run, h.step_errors)
        machine.boot_again()
        resume_to_succeeded(h, run_id, machine, data, expired=False)  # stopped for minutes: its token still lives


# ---------------------------------------------------------------- RunPod

def _runpod_launch(h: BootHarness, fake_rp: FakeRunPod, runtime_limit_s: int) -> tuple[str, str, dict[str, Any]]:
    run_id, run = launch(h, "runpod", "NVIDIA A40", runtime_limit_s)
    pod_input = fake_rp.creates()[0]["variables"]["input"]
    pod = next(p for p, v in fake_rp.pods.items() if v["name"] == pod_input["name"])
    return run_id, pod, pod_input


def _pod_env(fake_rp: FakeRunPod, pod: str) -> dict[str, str]:
    # What RunPod puts in every pod (the fake takes the account's key where RunPod issues a pod-scoped one).
    return {"RUNPOD_POD_ID": pod, "RUNPOD_API_KEY": RUNPOD_KEY, "RUNPOD_API_BASE_URL": fake_rp.url}


def test_runpod_resume_continues_from_the_checkpoint_on_the_kept_volume(
        boot_runpod_h: tuple[BootHarness, FakeRunPod], tmp_path: Path) -> None:
    h, fake_rp = boot_runpod_h
    run_id, pod, pod_input = _runpod_launch(h, fake_rp, runtime_limit_s=60)
    machine = machine_for(tmp_path / "pod", h)
    data = machine.root / "fs/runpod-volume/data"
    machine.start_pod(pod_input, _pod_env(fake_rp, pod))
    await_checkpoint(h, run_id, machine)
    retain_at_runtime_limit(h, run_id, machine, data)
    assert fake_rp.pods[pod]["desiredStatus"] == "EXITED"  # podStop: the GPU freed, the volume kept

    run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
    h.drain()
    assert run["state"] == "training" and fake_rp.pods[pod]["desiredStatus"] == "RUNNING", (run, h.step_errors)
    machine.start_pod(pod_input, _pod_env(fake_rp, pod))  # podResume: RunPod runs the entrypoint again
    resume_to_succeeded(h, run_id, machine, data)
    assert fake_rp.ops().count("podResume") == 1 and "podTerminate" in fake_rp.ops()  # released at the end


def test_runpod_pod_stops_itself_when_the_control_plane_is_gone(boot_runpod_h: tuple[BootHarness, FakeRunPod],
                                                                 plane: Any, tmp_path: Path) -> None:
    h, fake_rp = boot_runpod_h
    run_id, pod, pod_input = _runpod_launch(h, fake_rp, runtime_limit_s=7200)
    machine = machine_for(tmp_path / "pod", h, TENSORANT_UNREACHABLE_STOP_S=str(UNREACHABLE_S))
    data = machine.root / "fs/runpod-volume/data"
    machine.start_pod(pod_input, _pod_env(fake_rp, pod))
    await_checkpoint(h, run_id, machine)
    plane.stop()
    wait_for(lambda: fake_rp.pods[pod]["desiredStatus"] == "EXITED", "the pod to stop itself (podStop)", 90,
             machine=machine)
    stops = [r for r in fake_rp.requests if "podStop" in r["body"].get("query", "")]
    assert len(stops) == 1 and pod in stops[0]["body"]["query"], stops
    assert "podTerminate" not in fake_rp.ops()  # stopped, never terminated: the volume is kept
    wait_for(lambda: agent_state(data).get("self_stopped"), "the agent to record its self-stop", 30,
             machine=machine)
    machine.power_off()  # what RunPod's stop then does to the container
    assert_self_stopped_with_checkpoint(run_id, data)

    with back_and_retained(h, plane, run_id):
        run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
        h.drain()
        assert run["state"] == "training" and fake_rp.pods[pod]["desiredStatus"] == "RUNNING", (run, h.step_errors)
        machine.start_pod(pod_input, _pod_env(fake_rp, pod))
        resume_to_succeeded(h, run_id, machine, data, expired=False)


# ---------------------------------------------------------------- local

def test_local_resume_after_the_agents_token_expired(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local provider's retain freezes the agent (SIGSTOP) and its resume thaws it (SIGCONT): the agent comes
    back with the token it held, expired after a stop longer than a token lives, exchanges it once and trains to
    succeeded (its frozen trainer continuing, or run again from the checkpoint when the agent had heard stop:
    a race the local provider cannot order, tests/e2e/test_checkpoints_e2e.py)."""
    import sys
    import time

    from shared import clock, settings
    from shared.context import invocation
    from shared.services.timers.heartbeat_check import check_all
    from tests.e2e.local_host import TERMINAL_OR_RETAINED
    from tests.e2e.test_local_e2e import setup_org

    smoke = {"TENSORANT_SMOKE_STEPS": "8", "TENSORANT_SMOKE_STEP_SECONDS": "1", "TENSORANT_SMOKE_CHECKPOINT_EVERY": "2"}
    monkeypatch.setenv("TENSORANT_TRAINER_COMMAND",
                       "env " + " ".join(f"{k}={v}" for k, v in smoke.items()) + f" {sys.executable} -m machine.trainer.smoke")
    settings.reset_settings()
    try:
        project, dataset = setup_org(api)
        offer = api("GET", "/api/catalog/gpus?provider=local")["items"][0]
        run_id = api("POST", "/api/runs", json={
            "project_id": project, "dataset_version_id": dataset, "provider": "local", "offer_id": offer["offer_id"],
            "base_model": "tensorant/smoke-tiny", "price_limit_per_hour": 1.0, "runtime_limit_s": 60})["id"]
        api("POST", f"/api/runs/{run_id}/launch", json={"confirm": True})
        deadline = time.monotonic() + 90
        while not any("checkpoint adapter uploaded" in line for line in api("GET", f"/api/runs/{run_id}/logs")["lines"]):
            assert time.monotonic() < deadline, api("GET", f"/api/runs/{run_id}/logs")["lines"][-20:]
            time.sleep(0.2)

        clock.set_clock(lambda: time.time() + 120)  # the runtime limit passes at the next tick
        assert check_all(invocation())["retained"] == 1
        run = api.wait(f"/api/runs/{run_id}", lambda r: r["state"] in TERMINAL_OR_RETAINED, timeout=60)
        assert run["state"] == "retained", run
        s = get_settings()
        stopped = 120 + s.provisioning_timeout_s + s.agent_token_ttl_s + STOPPED_EXTRA_S
        clock.set_clock(lambda: time.time() + stopped)  # the machine stays frozen past its token's lifetime

        assert api("POST", f"/api/runs/{run_id}/recover", json={"mode": "resume"})["state"] == "training"
        run = api.wait(f"/api/runs/{run_id}", lambda r: r["state"] in TERMINAL_OR_RETAINED, timeout=120)
        lines = api("GET", f"/api/runs/{run_id}/logs")["lines"]
        assert run["state"] == "succeeded", (run["reason"], lines[-30:])
        assert [e["kind"] for e in run["events"] if "exchanged its expired token" in e["message"]] == ["audit"]
        assert any("the token was exchanged for a fresh one" in line for line in lines), lines[-30:]
    finally:
        clock.set_clock(None)
