"""The cloud path on a real machine (`make vm-check`; skipped in `make test`): issue 27.

An AWS launch on moto sends its user data; a Debian VM (tools/vm: QEMU under TCG, its real kernel,
systemd, cloud-init 22.4 and Docker Engine 20.10) boots with exactly that user data as its NoCloud
seed. Its script exchanges the claim with this control plane's HTTP host, `docker pull`s the training
container from a registry on loopback (Debian's docker-registry holding tools/vm/container.sh's image),
and `docker run --gpus all` starts the image's entrypoint, the agent. The guest reaches only
10.0.2.100 (the host's loopback ports it is given); the host reaches the same URLs through
tools.vm.vm.HostProxy, so the presigned S3 URLs signed for 10.0.2.100 work on both sides.

Time: the run's clock is the harness's simulated one, moved by the real seconds that pass, so billed
seconds are the VM's real ones. Each case prints its stages (uptime when each was seen) and, on a
failure, the serial console's last lines.

What still differs from a cloud VM: no GPU or NVIDIA driver (a no-op prestart hook stands in for the
NVIDIA container toolkit, so `--gpus all` is accepted and nothing is attached), NoCloud instead of
the cloud's metadata service (IMDSv2 on EC2, the OVF environment and IMDS on Azure), TCG emulation
(minutes to boot instead of seconds), and a slim image with the smoke trainer instead of the
multi-GB torch image (tools/image checks that one).
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.clock import now
from shared.models import RunState
from shared.store import get_store
from tests.e2e.boot import END, BootHarness, boot_harness

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    not os.environ.get("TENSORANT_VM_CHECK"), reason="make vm-check builds the VM and sets TENSORANT_VM_CHECK")]

CASE_TIMEOUT_S = float(os.environ.get("TENSORANT_VM_CASE_TIMEOUT_S", "1500"))
BOOT_LIMIT_S = 300  # cloud-init's first stage came at 46-84 s of uptime here


class VmRig:
    def __init__(self, work: Path) -> None:
        from tools.vm import vm

        self.vm = vm
        self.rootfs = vm.build_rootfs()
        self.local_image = vm.build_image()
        self.registry = vm.Registry(work / "registry")
        self.image = self.registry.push(self.local_image, "tensorant/trainer:vm")
        self.proxy = vm.HostProxy()

    def no_agent_image(self) -> str:
        """An image whose entrypoint exits at once, before any report (the agent cannot start)."""
        broken = self.vm.variant(self.local_image, "localhost/tensorant-vm-trainer:no-agent",
                                 ["python", "-c", "import sys; print('no agent in this image'); sys.exit(3)"])
        return self.registry.push(broken, "tensorant/trainer:no-agent")


@pytest.fixture(scope="module")
def vm_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmRig]:
    from tools.vm import vm

    missing = vm.missing_tools()
    if missing:
        pytest.skip(f"vm-check needs {', '.join(missing)}")
    rig = VmRig(tmp_path_factory.mktemp("vm"))
    try:
        yield rig
    finally:
        rig.registry.stop()
        rig.proxy.stop()


@pytest.fixture
def vm_plane(env: dict[str, str], moto_ec2_url: str, rig: Any, vm_rig: VmRig, monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path) -> Iterator[tuple[BootHarness, Any, int]]:
    """The control plane as the VM sees it (http://10.0.2.100:<port>), storage on moto through 10.0.2.100."""
    import function_app
    from shared.settings import reset_settings
    from tensorant_devhost.host import Host
    from tests.azurite import free_port
    from tests.e2e.local_host import ROOT

    port = free_port()
    moto_port = moto_ec2_url.rsplit(":", 1)[1]
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", f"http://{vm_rig.vm.GUEST_HOST}:{port}")
    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_ec2_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", rig.pricing.url)
    monkeypatch.setenv("TENSORANT_CONTAINER_IMAGE", vm_rig.image)
    monkeypatch.delenv("TENSORANT_TRAINER_COMMAND", raising=False)  # the image's own: the smoke trainer
    # The storage client pins each connection to the address it resolved (the SSRF guard, no proxy): here
    # 10.0.2.100 is the host's loopback, as the guest's forwards make it.
    from shared.org_storage import endpoint_guard

    resolve = endpoint_guard.resolve_checked
    monkeypatch.setattr(endpoint_guard, "resolve_checked", lambda host, port, **kw: (
        "127.0.0.1" if host == vm_rig.vm.GUEST_HOST else resolve(host, port, **kw)))
    reset_settings()
    host = Host(function_app.app, root=ROOT, port=port, load_settings=False, queues=False, timers=False).start()
    try:
        with vm_rig.vm.proxied(vm_rig.proxy):
            h = boot_harness(tmp_path, f"http://{vm_rig.vm.GUEST_HOST}:{moto_port}")
            conn = h.save_compute("aws", rig.body(workspace_disk_gb=50))
            assert conn["status"] == "connected", conn["checks"]
            yield h, rig.ec2, port
            h.close()
    finally:
        host.stop()


def _launch(h: BootHarness, ec2: Any) -> tuple[str, str]:
    offer = next(o for o in h.ok("GET", "/api/catalog/gpus", params={"provider": "aws"})["items"]
                 if o["machine_type"] == "g6.xlarge")
    run_id = h.create_run("aws", offer["offer_id"], runtime_limit_s=7200)
    run = h.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], h.step_errors)
    instance = next(r["id"] for r in run["resources"] if r["kind"] == "instance")
    raw = ec2.describe_instance_attribute(InstanceId=instance, Attribute="userData")["UserData"]["Value"]
    return run_id, base64.b64decode(raw).decode()


class Case:
    """One VM booted with the run's user data, driven until the run ends; its stages timed."""

    def __init__(self, name: str, vm_rig: VmRig, h: BootHarness, port: int, tmp_path: Path, *,
                 gpu_hook: bool = True, registry: bool = True) -> None:
        self.name, self.h = name, h
        self.stages: dict[str, float] = {}
        self.boots = 0
        forwards = {port: port, vm_rig.vm.REGISTRY_GUEST_PORT: vm_rig.registry.port if registry else vm_rig.vm.free_port()}
        moto_port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
        forwards[moto_port] = moto_port
        base = Path(os.environ["TENSORANT_VM_WORK"]) / tmp_path.name if os.environ.get("TENSORANT_VM_WORK") else tmp_path
        self.forwards, self.gpu_hook, self.vm_rig, self.work = forwards, gpu_hook, vm_rig, base / name

    def boot(self, user_data: str) -> Case:
        self.boots += 1
        started = time.monotonic()
        self.machine = self.vm_rig.vm.Vm(self.vm_rig.rootfs, self.work, user_data, forwards=self.forwards,
                                         gpu_hook=self.gpu_hook).start()
        self.stages["disk made"] = time.monotonic() - started
        return self

    def drive(self, run_id: str, until: set[str] = END, power_off_at: float = 0) -> dict[str, Any]:
        """Until the run is in `until` (simulated clock moved by real seconds), then the VM is stopped."""
        last = time.monotonic()
        seen: set[str] = set()
        try:
            while True:
                t = time.monotonic()
                self.h.clock.advance(t - last)
                last = t
                self.h.drain()
                run: dict[str, Any] = self.h.get_run(run_id)
                up = self.machine.uptime()
                if run["state"] not in seen:
                    seen.add(run["state"])
                    self.stages[f"run {run['state']}"] = up
                    if run["state"] != "provisioning" and "first report" not in self.stages:
                        self.stages["first report"] = up  # the agent's first heartbeat (or the machine's failure)
                for marker, stage in (("running 'init-local'", "cloud-init init-local"),
                                      ("running 'modules:final'", "cloud-init final (runcmd)"),
                                      ("claim exchanged", "claim exchanged"), ("starting the training", "pulled")):
                    if stage not in self.stages and marker in self.machine.console():
                        self.stages[stage] = up
                if run["state"] in until:
                    return run
                if "cloud-init init-local" not in self.stages and up > BOOT_LIMIT_S:
                    # The emulator, not the product: a VM that never reached cloud-init (it takes about a
                    # minute here) is booted once more with the same user data, said on the output; the
                    # second time it is a failure of the check's machine, named as such.
                    if self.boots > 1:
                        raise AssertionError(f"vm-check INFRASTRUCTURE: {self.name}'s VM twice did not reach "
                                             f"cloud-init in {BOOT_LIMIT_S} s:\n{self.console_tail()}")
                    print(f"\nvm-check {self.name}: the VM did not reach cloud-init in {BOOT_LIMIT_S} s; booting "
                          "it again", flush=True)
                    self.machine.stop()
                    self.boot(self.machine.user_data)
                    continue
                if power_off_at and up > power_off_at and self.machine.running():
                    self.machine.stop()
                    self.stages["powered off"] = up
                if up > CASE_TIMEOUT_S:
                    raise AssertionError(f"{self.name}: the run is still {run['state']} after {up:.0f} s; the "
                                         f"console's last lines:\n{self.console_tail()}")
                time.sleep(2)
        finally:
            self.machine.stop()
            self.report()

    def console_tail(self, lines: int = 60) -> str:
        return "\n".join(self.machine.console().splitlines()[-lines:])

    def report(self) -> None:
        print(f"\nvm-check {self.name}: " + ", ".join(f"{k} {v:.0f} s" for k, v in self.stages.items()), flush=True)


def _record(h: BootHarness, run_id: str) -> Any:
    return get_store().runs.get("org-a", run_id)[0]


def test_vm_succeeded(vm_plane: tuple[BootHarness, Any, int], vm_rig: VmRig, tmp_path: Path) -> None:
    h, ec2, port = vm_plane
    run_id, user_data = _launch(h, ec2)
    case = Case("succeeded", vm_rig, h, port, tmp_path).boot(user_data)
    run = case.drive(run_id)
    assert run["state"] == "succeeded", f"{run['reason']}\n{case.console_tail()}"
    assert "claim exchanged" in case.stages and "pulled" in case.stages, case.stages
    record = _record(h, run_id)
    assert record.bootstrap_claimed_at is not None and record.adapter_sha256
    print(f"vm-check succeeded: boot to first heartbeat {case.stages['first report']:.0f} s, billed "
          f"{run['billed_machine_s']:.0f} s")


def test_vm_no_nvidia_runtime_is_the_engines_own_exit_125(vm_plane: tuple[BootHarness, Any, int], vm_rig: VmRig,
                                                          tmp_path: Path) -> None:
    h, ec2, port = vm_plane
    run_id, user_data = _launch(h, ec2)
    case = Case("no-runtime", vm_rig, h, port, tmp_path, gpu_hook=False).boot(user_data)
    run = case.drive(run_id)
    assert run["state"] == "failed", f"{run['reason']}\n{case.console_tail()}"
    assert "could not start the training container (exit code 125" in run["reason"], run["reason"]
    assert "could not select device driver" in run["reason"], run["reason"]  # Docker Engine's own words
    assert _record(h, run_id).state == RunState.failed
    print(f"vm-check no-runtime: billed {run['billed_machine_s']:.0f} s (without the machine's report: the boot "
          "deadline's 900 s)")


def test_vm_registry_down_fails_the_pull(vm_plane: tuple[BootHarness, Any, int], vm_rig: VmRig,
                                         tmp_path: Path) -> None:
    h, ec2, port = vm_plane
    run_id, user_data = _launch(h, ec2)
    case = Case("registry-down", vm_rig, h, port, tmp_path, registry=False).boot(user_data)
    run = case.drive(run_id)
    assert run["state"] == "failed", f"{run['reason']}\n{case.console_tail()}"
    assert "could not pull the training image" in run["reason"] and "after 4 attempts" in run["reason"], run["reason"]
    print(f"vm-check registry-down: billed {run['billed_machine_s']:.0f} s")


def test_vm_powered_off_before_its_first_report(vm_plane: tuple[BootHarness, Any, int], vm_rig: VmRig,
                                                tmp_path: Path) -> None:
    from shared.settings import get_settings

    h, ec2, port = vm_plane
    run_id, user_data = _launch(h, ec2)
    case = Case("powered-off", vm_rig, h, port, tmp_path).boot(user_data)
    while "Linux version" not in case.machine.console() and case.machine.uptime() < 120:
        time.sleep(1)
    case.machine.stop()  # powered off as its kernel started: before cloud-init, before any report
    case.stages["powered off"] = case.machine.uptime()
    case.report()
    deadline = _record(h, run_id).deadlines
    assert deadline.first_report_by is not None and deadline.provisioning_by is not None
    assert deadline.first_report_by < deadline.provisioning_by
    # heartbeat-check releases it at its first-report deadline, minutes after the create call, not the boot's.
    h.serve((deadline.first_report_by - now()).total_seconds() + 61)
    h.drain()
    run = h.get_run(run_id)
    assert run["state"] == "failed" and "first-report deadline" in run["reason"], run["reason"]
    assert run["billed_machine_s"] < get_settings().provisioning_timeout_s, run["billed_machine_s"]
    print(f"vm-check powered-off: released at the first-report deadline, billed {run['billed_machine_s']:.0f} s "
          f"(the boot deadline: {get_settings().provisioning_timeout_s} s)")


def _use_image(monkeypatch: pytest.MonkeyPatch, image: str) -> None:
    from shared.settings import reset_settings

    monkeypatch.setenv("TENSORANT_CONTAINER_IMAGE", image)
    reset_settings()


def test_vm_image_missing_fails_the_pull(vm_plane: tuple[BootHarness, Any, int], vm_rig: VmRig, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    h, ec2, port = vm_plane
    _use_image(monkeypatch, vm_rig.image.replace(":vm", ":no-such-tag"))
    run_id, user_data = _launch(h, ec2)
    case = Case("image-missing", vm_rig, h, port, tmp_path).boot(user_data)
    run = case.drive(run_id)
    assert run["state"] == "failed", f"{run['reason']}\n{case.console_tail()}"
    assert "could not pull the training image" in run["reason"] and "manifest" in run["reason"], run["reason"]
    print(f"vm-check image-missing: billed {run['billed_machine_s']:.0f} s")


def test_vm_agent_that_exits_at_start_is_reported(vm_plane: tuple[BootHarness, Any, int], vm_rig: VmRig,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h, ec2, port = vm_plane
    _use_image(monkeypatch, vm_rig.no_agent_image())
    run_id, user_data = _launch(h, ec2)
    case = Case("agent-exits", vm_rig, h, port, tmp_path).boot(user_data)
    run = case.drive(run_id)
    assert run["state"] == "failed", f"{run['reason']}\n{case.console_tail()}"
    assert "agent exited before it reported (exit code 3" in run["reason"], run["reason"]
    assert "no agent in this image" in run["reason"], run["reason"]  # the container's own last line
    print(f"vm-check agent-exits: billed {run['billed_machine_s']:.0f} s")


def pod_user_data(pod_input: dict[str, Any]) -> str:
    """A RunPod pod as RunPod runs it, on the VM's Docker Engine: the pod's image pulled, its entrypoint
    started with the pod's env list and its network volume at the mount path (no cloud-init script of ours)."""
    import json

    env = "".join(f"{item['key']}={item['value']}\n" for item in pod_input["env"])
    assert all("\n" not in str(item["value"]) for item in pod_input["env"])
    run = (f"docker pull {pod_input['imageName']} && docker run --name {pod_input['name']} --gpus all --env-file "
           f"/etc/runpod/pod.env -v /runpod-volume:{pod_input['volumeMountPath']} {pod_input['imageName']}")
    indented = "".join(f"      {line}\n" for line in env.splitlines())
    return ("#cloud-config\nwrite_files:\n  - path: /etc/runpod/pod.env\n    permissions: '0600'\n    content: |\n"
            f"{indented}runcmd:\n  - [ sh, -c, {json.dumps(run)} ]\n")


def test_vm_runpod_pod_spec_runs_the_agent_to_succeeded(vm_plane: tuple[BootHarness, Any, int], vm_rig: VmRig,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.e2e.test_bootstrap_e2e import RUNPOD_KEY, _runpod_launch
    from tests.providers.runpod.fake_server import FakeRunPod

    h, _, port = vm_plane
    fake_rp = FakeRunPod(api_key=RUNPOD_KEY).start()
    try:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", fake_rp.url)
        assert h.save_compute("runpod", {"api_key": RUNPOD_KEY})["status"] == "connected"
        run_id = _runpod_launch(h)
        pod_input = fake_rp.creates()[0]["variables"]["input"]
        case = Case("runpod", vm_rig, h, port, tmp_path).boot(pod_user_data(pod_input))
        run = case.drive(run_id)
    finally:
        fake_rp.stop()
    assert run["state"] == "succeeded", f"{run['reason']}\n{case.console_tail()}"
    print(f"vm-check runpod: boot to first heartbeat {case.stages['first report']:.0f} s, billed "
          f"{run['billed_machine_s']:.0f} s")
