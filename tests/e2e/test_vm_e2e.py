"""The cloud path on a real machine (`make vm-check`; skipped in `make test`): issue 27.

An AWS launch on moto sends its user data; a Debian VM (tools/vm: QEMU under TCG, its real kernel,
systemd, cloud-init 22.4 and Docker Engine 20.10) boots and reads exactly that user data the way EC2
serves it: cloud-init's own Ec2 datasource, from an instance metadata service at 169.254.169.254 that
answers only with an IMDSv2 token (tools/vm/imds.py). cloud-init writes the script and the unit
tensorant-run.service and starts it; the script exchanges the claim with this control plane's HTTP
host, `docker pull`s the training container from a registry on loopback (Debian's docker-registry
holding tools/vm/container.sh's image), and `docker run --gpus all` starts the image's entrypoint, the
agent. The guest reaches only 10.0.2.100 (the host's loopback ports it is given) and the metadata
service; the host reaches the same URLs through tools.vm.vm.HostProxy, so the presigned S3 URLs signed
for 10.0.2.100 work on both sides. A retained machine is stopped (a clean shutdown) and booted again
from the same disk by `recover --start`.

Time: the run's clock is the harness's simulated one, moved by the real seconds that pass, so billed
seconds are the VM's real ones. Each case prints its stages (uptime when each was seen) and, on a
failure, the serial console's last lines.

What still differs from a cloud VM: no GPU or NVIDIA driver (a no-op prestart hook stands in for the
NVIDIA container toolkit, so `--gpus all` is accepted and nothing is attached), a metadata service that
serves what cloud-init reads and not all of EC2's (no DMI says "Amazon EC2": the datasource is named in
the image's config; Azure's OVF environment and IMDS are not played), TCG emulation
(minutes to boot instead of seconds), and a slim image with the smoke trainer instead of the
multi-GB torch image (tools/image checks that one).
"""

from __future__ import annotations

import base64
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.clock import now
from shared.models import RunState
from shared.providers import cloudinit
from shared.store import get_store
from tests.e2e.boot import END, BootHarness, boot_harness
from tests.e2e.boot_limit import boot_limit_s, measure

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    not os.environ.get("TENSORANT_VM_CHECK"), reason="make vm-check builds the VM and sets TENSORANT_VM_CHECK")]

CASE_TIMEOUT_S = float(os.environ.get("TENSORANT_VM_CASE_TIMEOUT_S", "1500"))
# The limit to reach cloud-init: derived from the machine's speed at each boot (tests/e2e/boot_limit.py).
# The smoke trainer's checkpoint mode (machine/trainer/smoke.py) as the image's ENV: a checkpoint every 2 steps
# of 6, held after step 4 until the run is stopped; heartbeats every 5 s (a stopped agent asks that often
# whether to resume).
CHECKPOINT_ENV = {"TENSORANT_SMOKE_STEPS": "6", "TENSORANT_SMOKE_STEP_SECONDS": "1",
                  "TENSORANT_SMOKE_CHECKPOINT_EVERY": "2", "TENSORANT_SMOKE_HOLD_AT": "4",
                  "TENSORANT_HEARTBEAT_INTERVAL_S": "5"}
HOLD = 4
# What each boot's serial console shows, and the stage it marks (the training unit's output reaches the console
# through tools/vm's drop-in; systemd prints the unit's start).
MARKERS = (("running 'init-local'", "cloud-init init-local"), ("running 'modules:final'", "cloud-init final"),
           ("Started tensorant-run", "unit started"), ("claim exchanged", "claim exchanged"),
           ("not pulled again", "image kept"), ("starting the training", "pulled"),
           ("waiting for the control plane to say resume", "agent waits for a resume"))


class VmRig:
    def __init__(self, work: Path) -> None:
        from tools.vm import vm

        self.vm = vm
        self.rootfs = vm.build_rootfs()
        self.local_image = vm.build_image()
        self.registry = vm.Registry(work / "registry")
        self.image = self.registry.push(self.local_image, "tensorant/trainer:vm")
        self.proxy = vm.HostProxy()

    def checkpoint_image(self) -> str:
        """The image with the smoke trainer's checkpoint mode in its ENV (CHECKPOINT_ENV)."""
        image = self.vm.variant(self.local_image, "localhost/tensorant-vm-trainer:checkpoint", env=CHECKPOINT_ENV)
        return self.registry.push(image, "tensorant/trainer:checkpoint")

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


def _launch(h: BootHarness, ec2: Any, runtime_limit_s: int = 7200) -> tuple[str, str]:
    offer = next(o for o in h.ok("GET", "/api/catalog/gpus", params={"provider": "aws"})["items"]
                 if o["machine_type"] == "g6.xlarge")
    run_id = h.create_run("aws", offer["offer_id"], runtime_limit_s=runtime_limit_s)
    run = h.launch(run_id)
    assert run["state"] == "provisioning", (run["reason"], h.step_errors)
    instance = next(r["id"] for r in run["resources"] if r["kind"] == "instance")
    raw = ec2.describe_instance_attribute(InstanceId=instance, Attribute="userData")["UserData"]["Value"]
    return run_id, base64.b64decode(raw).decode()


def _plain(console: str) -> str:
    """The serial console without systemd's colours."""
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", console)


class Case:
    """One VM booted with the run's user data, driven until the run ends; its stages timed per boot. The run's
    simulated clock moves by the real seconds that pass (tick), so billed time is the VM's real time."""

    def __init__(self, name: str, vm_rig: VmRig, h: BootHarness, port: int, tmp_path: Path, *,
                 gpu_hook: bool = True, registry: bool = True, imds: bool = True) -> None:
        """imds: the user data served as EC2 serves it (tools/vm/imds.py, IMDSv2), else as a NoCloud seed."""
        self.name, self.h, self.use_imds = name, h, imds
        self.imds: Any = None
        self.stages: dict[str, float] = {}
        self.tries = 0
        forwards = {port: port, vm_rig.vm.REGISTRY_GUEST_PORT: vm_rig.registry.port if registry else vm_rig.vm.free_port()}
        moto_port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
        forwards[moto_port] = moto_port
        base = Path(os.environ["TENSORANT_VM_WORK"]) / tmp_path.name if os.environ.get("TENSORANT_VM_WORK") else tmp_path
        self.forwards, self.gpu_hook, self.vm_rig, self.work = forwards, gpu_hook, vm_rig, base / name
        self.last = time.monotonic()
        self.boot_limit_s = self.measure_speed()

    def measure_speed(self) -> float:
        """The boot limit from the machine's speed now (tests/e2e/boot_limit.py), said on the output."""
        wall, cpu = measure()
        limit = boot_limit_s(wall, cpu, ceiling_s=CASE_TIMEOUT_S)
        print(f"\nvm-check {self.name}: fixed work took {wall:.2f} s ({cpu:.2f} s of CPU): boot limit {limit:.0f} s",
              flush=True)
        return limit

    def boot(self, user_data: str) -> Case:
        """The machine's first boot: a fresh disk with the user data."""
        from tools.vm.imds import Imds

        self.tries += 1
        self.boot_limit_s = self.measure_speed()
        started = time.monotonic()
        if self.use_imds and self.imds is None:
            self.imds = Imds(user_data)
        self.machine = self.vm_rig.vm.Vm(self.vm_rig.rootfs, self.work, user_data, forwards=self.forwards,
                                         gpu_hook=self.gpu_hook,
                                         imds_port=self.imds.port if self.imds else None).start()
        self.stages["disk made"] = time.monotonic() - started
        return self

    def reboot(self) -> Case:
        """The cloud started the stopped machine again: the same disk boots."""
        self.tries = 1
        self.boot_limit_s = self.measure_speed()
        self.machine.start(fresh=False)
        return self

    def stage(self, name: str) -> str:
        return name if self.machine.boots == 1 else f"boot {self.machine.boots}: {name}"

    def tick(self) -> None:
        t = time.monotonic()
        self.h.clock.advance(t - self.last)
        self.last = t

    def drive(self, run_id: str, until: set[str] = END, power_off_at: float = 0, *, done: Any = None,
              keep: bool = False) -> dict[str, Any]:
        """Until the run is in `until` or done(run) holds; then the VM is stopped (its disk removed) unless `keep`."""
        seen: set[str] = set()
        try:
            while True:
                self.tick()
                self.h.drain()
                run: dict[str, Any] = self.h.get_run(run_id)
                up = self.machine.uptime()
                if run["state"] not in seen:
                    seen.add(run["state"])
                    self.stages.setdefault(self.stage(f"run {run['state']}"), up)
                    if run["state"] != "provisioning" and "first report" not in self.stages:
                        self.stages["first report"] = up  # the agent's first heartbeat (or the machine's failure)
                self.mark(up)
                if run["state"] in until or (done is not None and done(run)):
                    return run
                if self.stage("cloud-init init-local") not in self.stages and up > self.boot_limit_s:
                    # The emulator, not the product: a VM that never reached cloud-init (it takes about a
                    # minute here) is booted once more from the same disk, said on the output; the second
                    # time it is a failure of the check's machine, named as such.
                    if self.tries > 1:
                        raise AssertionError(f"vm-check INFRASTRUCTURE: {self.name}'s VM twice did not reach "
                                             f"cloud-init in {self.boot_limit_s:.0f} s:\n{self.console_tail()}")
                    print(f"\nvm-check {self.name}: the VM did not reach cloud-init in {self.boot_limit_s:.0f} s; booting "
                          "it again", flush=True)
                    self.tries += 1
                    self.boot_limit_s = self.measure_speed()
                    self.machine.kill()
                    self.machine.start(fresh=self.machine.boots == 1)
                    continue
                if power_off_at and up > power_off_at and self.machine.running():
                    self.machine.stop()
                    self.stages["powered off"] = up
                if up > CASE_TIMEOUT_S:
                    raise AssertionError(f"{self.name}: the run is still {run['state']} after {up:.0f} s; the "
                                         f"console's last lines:\n{self.console_tail()}")
                time.sleep(2)
        finally:
            if not keep:
                self.close()

    def close(self) -> None:
        """The machine deleted: QEMU killed, its disk removed, its metadata service gone; the stages printed."""
        self.machine.stop()
        if self.imds is not None:
            self.imds.stop()
        self.report()

    def mark(self, up: float) -> None:
        console = _plain(self.machine.console())
        for marker, name in MARKERS:
            if self.stage(name) not in self.stages and marker in console:
                self.stages[self.stage(name)] = up

    def wait_console(self, marker: str, timeout: float) -> None:
        """Until the current boot's console shows `marker`, the control plane serving meanwhile."""
        deadline = time.monotonic() + timeout
        while marker not in self.machine.console():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {marker!r} not on the console in {timeout:.0f} s:\n"
                                     f"{self.console_tail()}")
            self.tick()
            self.h.drain()
            self.mark(self.machine.uptime())
            time.sleep(2)

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
    # cloud-init's Ec2 datasource read the user data from the metadata service, each time with an IMDSv2 token
    # (the AWS provider launches with HttpTokens=required; tools/vm/imds.py answers nothing without one).
    reads = case.imds.user_data_reads()
    assert reads and all(reads), case.imds.requests
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
    from tests.e2e.boot import RUNPOD_KEY
    from tests.e2e.test_bootstrap_e2e import _runpod_launch
    from tests.providers.runpod.fake_server import FakeRunPod

    h, _, port = vm_plane
    fake_rp = FakeRunPod(api_key=RUNPOD_KEY).start()
    try:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", fake_rp.url)
        assert h.save_compute("runpod", {"api_key": RUNPOD_KEY})["status"] == "connected"
        run_id = _runpod_launch(h)
        pod_input = fake_rp.creates()[0]["variables"]["input"]
        case = Case("runpod", vm_rig, h, port, tmp_path, imds=False).boot(pod_user_data(pod_input))
        run = case.drive(run_id)
    finally:
        fake_rp.stop()
    assert run["state"] == "succeeded", f"{run['reason']}\n{case.console_tail()}"
    print(f"vm-check runpod: boot to first heartbeat {case.stages['first report']:.0f} s, billed "
          f"{run['billed_machine_s']:.0f} s")


def test_vm_azure_custom_data_runs_the_agent_to_succeeded(arm: Any, vm_plane: tuple[BootHarness, Any, int],
                                                          vm_rig: VmRig, tmp_path: Path) -> None:
    """Azure's customData exactly as the Azure provider sent it to the fake ARM, booted as a NoCloud seed:
    cloud-init's Azure datasource needs the platform's wireserver and OVF media, which no loopback fake
    serves, so what differs from Azure is the datasource, not the user data."""
    from tests.e2e.test_bootstrap_e2e import _azure_launch
    from tests.providers.azure.rig import config_body

    h, _, port = vm_plane
    conn = h.save_compute("azure", config_body())
    assert conn["status"] == "connected", conn["checks"]
    run_id, _, user_data = _azure_launch(h, arm)
    case = Case("azure", vm_rig, h, port, tmp_path, imds=False).boot(user_data)
    run = case.drive(run_id)
    assert run["state"] == "succeeded", f"{run['reason']}\n{case.console_tail()}"
    assert "claim exchanged" in case.stages and "pulled" in case.stages, case.stages
    print(f"vm-check azure: boot to first heartbeat {case.stages['first report']:.0f} s, billed "
          f"{run['billed_machine_s']:.0f} s")


def _logs(h: BootHarness, run_id: str) -> list[str]:
    return list(h.ok("GET", f"/api/runs/{run_id}/logs")["lines"])


def test_vm_retained_machine_started_again_by_recover(vm_plane: tuple[BootHarness, Any, int], vm_rig: VmRig,
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A retained run's machine, stopped as a cloud stops it (a clean shutdown, disk kept), then started again by
    `recover --start`: the same disk boots; cloud-init does not run runcmd again (same instance), systemd
    starts the enabled unit; the script neither exchanges the claim again nor pulls; the agent on the kept
    disk finds its stop and its checkpoint and waits. `recover --resume` then trains on from the checkpoint
    to succeeded. The runtime limit (60 s) has passed by the time the checkpoint is held: heartbeat-check's
    first tick retains the run (the limit is absolute)."""
    from tools.vm import vm

    assert vm.UNIT == cloudinit.UNIT_NAME
    h, ec2, port = vm_plane
    _use_image(monkeypatch, vm_rig.checkpoint_image())
    run_id, user_data = _launch(h, ec2, runtime_limit_s=60)
    instance = next(r["id"] for r in h.get_run(run_id)["resources"] if r["kind"] == "instance")
    case = Case("rebooted", vm_rig, h, port, tmp_path).boot(user_data)
    try:
        def held(run: dict[str, Any]) -> bool:
            lines = _logs(h, run_id)
            return (any(f"checkpoint adapter uploaded (step-{HOLD:06d}" in line for line in lines)
                    and any(f"holding at step {HOLD}" in line for line in lines))

        run = case.drive(run_id, done=held, keep=True)
        assert run["state"] == "training", f"{run['reason']}\n{case.console_tail()}"
        h.tick("heartbeat_check")  # the runtime limit has passed: retained, and EC2 stops the instance
        run = case.drive(run_id, until={"retained", "failed", "succeeded", "cancelled"}, keep=True)
        assert run["state"] == "retained" and "runtime limit" in run["reason"], run["reason"]
        case.wait_console("training is not run again and the output is kept", 180)  # the agent recorded its stop

        # EC2 stopped the instance: the guest shuts down cleanly, the unit's ExecStop stops the container.
        t = time.monotonic()
        clean = case.machine.shutdown(timeout=300)
        case.tick()
        case.stages["shut down"] = time.monotonic() - t
        first = _plain(case.machine.console())
        assert clean, f"the guest did not shut down within 300 s:\n{case.console_tail()}"
        # systemd stopped the unit (ExecStop: docker stop, the agent's SIGTERM, then the script's SIGTERM: a stop
        # neither reports a failed start nor powers off).
        assert "Stopped tensorant-run" in first, first[-3000:]
        assert "reported the failure" not in first and "asked for a poweroff" not in first, first[-3000:]

        run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
        state = ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]["Name"]
        assert run["state"] == "retained" and state == "running", (run, state)
        case.reboot()
        run = case.drive(run_id, until={"failed", "succeeded", "cancelled"}, keep=True,
                         done=lambda r: "waiting for the control plane to say resume" in case.machine.console())
        second = _plain(case.machine.console())
        assert run["state"] == "retained", f"{run['reason']}\n{case.console_tail()}"
        # runcmd's `systemctl enable` said "Created symlink" at the first boot only; the claim is not exchanged
        # again (the environment is on the disk); the image is not pulled again; the container starts again.
        if "Created symlink" in first:
            assert "Created symlink" not in second, second[-3000:]
        assert "claim exchanged" not in second and "pulling " not in second, second[-3000:]
        assert "not pulled again" in second and "starting the training container" in second, second[-3000:]

        run = h.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "resume"})
        assert run["state"] == "training", run
    except BaseException:
        case.close()
        raise
    run = case.drive(run_id)
    assert run["state"] == "succeeded", f"{run['reason']}\n{case.console_tail()}"
    assert run["adapter_kind"] == "final", run
    lines = _logs(h, run_id)
    assert any(f"resuming from step-{HOLD:06d}" in line for line in lines), lines[-30:]
    events = [e["message"] for e in run["events"]]
    assert not any("second exchange" in m for m in events), events
    print(f"vm-check rebooted: billed {run['billed_machine_s']:.0f} s of machine, {run['billed_disk_only_s']:.0f} s "
          "of disk only")
