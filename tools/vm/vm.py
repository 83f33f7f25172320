"""A cloud machine played by a real VM: QEMU boots the Debian image of tools/vm/build.sh with the
user data a launch sent, and its real cloud-init, systemd and Docker Engine run it (`make vm-check`,
tests/e2e/test_vm_e2e.py). Standard library only.

The guest reaches nothing but the host's loopback ports it is given (QEMU user networking with
restrict=on; each `guestfwd` of 10.0.2.100:PORT runs tools/vm/relay.py per connection), so a case
never leaves this machine. What the guest sees as 10.0.2.100 the host reaches through `HostProxy`
(an HTTP proxy mapping 10.0.2.100:PORT to 127.0.0.1:PORT), so a presigned URL signed for
10.0.2.100 works on both sides.

QEMU runs in its own process group with PR_SET_PDEATHSIG: it dies with the process that started
it, so a test cut short leaves no VM behind; `Vm.stop` kills it and removes its disk. `Vm.shutdown`
stops it the way a cloud stops a machine (the guest shuts down cleanly; this image has no ACPI
handler, so the host's "power button" is a line on the guest's second serial port), and `Vm.start`
with `fresh=False` boots the same disk again.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
GUEST_HOST = "10.0.2.100"  # the host, as the guest reaches it
REGISTRY_GUEST_PORT = 5000  # the image's /etc/docker/daemon.json trusts 10.0.2.100:5000 over HTTP
HOOK = "/usr/local/lib/tensorant-vm/nvidia-container-runtime-hook"
DISK_SIZE = "6G"
UNIT = "tensorant-run.service"  # shared/providers/cloudinit.UNIT_NAME (this module imports nothing of the app)
EC2_UUID = "ec2e1916-9099-7caf-fd21-0123456789ab"  # an EC2 machine's DMI system uuid starts with "ec2"
# The guest's power button: a line "poweroff" on its ttyS1 (QEMU's -serial pipe: <work>/ctl.in, ctl.out).
POWER_BUTTON = """#!/bin/sh
# vm-check: the host asks for a clean shutdown, as a cloud's stop does (this image has no logind or acpid).
exec </dev/ttyS1
stty -echo icanon
while read -r line; do
    if [ "$line" = poweroff ]; then exec systemctl poweroff; fi
done
"""
POWER_UNIT = """[Unit]
Description=vm-check: the host's power button on ttyS1

[Service]
ExecStart=/usr/local/lib/tensorant-vm/power-button

[Install]
WantedBy=multi-user.target
"""
# The training unit's output on the serial console too, so a case sees its stages and prints them on a
# failure; a cloud VM keeps it in the journal (shared/providers/cloudinit.py).
CONSOLE_DROP_IN = "[Service]\nStandardOutput=journal+console\n"


class Unavailable(Exception):
    """What vm-check needs is not on this machine (QEMU, mmdebstrap, root): the check is skipped."""


def missing_tools() -> list[str]:
    wanted = ["qemu-system-x86_64", "mmdebstrap", "mkfs.ext4", "docker-registry", "buildah", "podman"]
    out = [t for t in wanted if shutil.which(t) is None]
    if os.geteuid() != 0:
        out.append("root (mmdebstrap and buildah --isolation chroot)")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    os.setpgrp()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def build_rootfs() -> Path:
    """The cached root filesystem (tools/vm/build.sh builds it once per recipe)."""
    done = subprocess.run([str(HERE / "build.sh")], cwd=REPO, capture_output=True, text=True)
    if done.returncode == 3:
        raise Unavailable(done.stderr.strip())
    if done.returncode != 0:
        raise RuntimeError(f"tools/vm/build.sh failed:\n{done.stderr[-4000:]}")
    return REPO / done.stdout.strip().splitlines()[-1]


def build_image() -> str:
    """The training container's name in local container storage (tools/vm/container.sh)."""
    done = subprocess.run([str(HERE / "container.sh")], cwd=REPO, capture_output=True, text=True)
    if done.returncode == 3:
        raise Unavailable(done.stderr.strip())
    if done.returncode != 0:
        raise RuntimeError(f"tools/vm/container.sh failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


class Registry:
    """Debian's docker-registry (Distribution 2.8) on a loopback port, its storage under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n")
        with open(root / "registry.log", "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                                         stderr=log, preexec_fn=_die_with_parent)
        _wait_port(self.port, "docker-registry")

    def push(self, local: str, name: str) -> str:
        """Pushes a local image as `name` (e.g. tensorant/trainer:vm); returns how the guest names it."""
        subprocess.run(["podman", "push", "--quiet", "--tls-verify=false", "--format", "v2s2", local,
                        f"docker://127.0.0.1:{self.port}/{name}"], check=True, capture_output=True)
        return f"{GUEST_HOST}:{REGISTRY_GUEST_PORT}/{name}"

    def stop(self) -> None:
        _kill(self.proc)


def variant(local: str, tag: str, entrypoint: list[str] | None = None, env: dict[str, str] | None = None) -> str:
    """The local image with another entrypoint (a broken image, for a case) or more ENV, committed as `tag`."""
    import json

    ctr = subprocess.run(["buildah", "from", "--quiet", "--pull-never", local], check=True, capture_output=True,
                         text=True).stdout.strip()
    try:
        config = ["--entrypoint", json.dumps(entrypoint)] if entrypoint is not None else []
        for key, value in (env or {}).items():
            config += ["--env", f"{key}={value}"]
        subprocess.run(["buildah", "config", *config, ctr], check=True, capture_output=True)
        subprocess.run(["buildah", "commit", "--quiet", "--format", "docker", ctr, tag], check=True,
                       capture_output=True)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
    return tag


def _wait_port(port: int, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s")


class HostProxy:
    """An HTTP proxy (plain http only) that sends a request for 10.0.2.100:PORT to 127.0.0.1:PORT, Host
    header untouched: the host's clients reach what the guest reaches under the same URL (a presigned
    URL's signature covers its host). Use it as HTTP_PROXY with NO_PROXY=127.0.0.1,localhost."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(client,), daemon=True).start()

    def _one(self, client: socket.socket) -> None:
        with client:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            line, _, rest = head.partition(b"\r\n")
            method, url, version = line.decode("latin-1").split(" ", 2)
            prefix = f"http://{GUEST_HOST}:"
            if not url.startswith(prefix):
                client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            port_text, _, path = url[len(prefix):].partition("/")
            # One request per connection: the upstream sees origin-form and Connection: close.
            headers = [h for h in rest.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
                       if h and not h.lower().startswith((b"connection:", b"proxy-connection:"))]
            body = rest.split(b"\r\n\r\n", 1)[1]
            with socket.create_connection(("127.0.0.1", int(port_text)), timeout=60) as up:
                up.sendall(f"{method} /{path} {version}\r\n".encode("latin-1") + b"\r\n".join(headers)
                           + b"\r\nConnection: close\r\n\r\n" + body)
                _pump(client, up)

    def stop(self) -> None:
        self.sock.close()


def _pump(a: socket.socket, b: socket.socket) -> None:
    def one_way(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    t = threading.Thread(target=one_way, args=(a, b), daemon=True)
    t.start()
    one_way(b, a)
    t.join(timeout=60)


class Vm:
    """One case's machine: a fresh disk from the cached root filesystem with a NoCloud seed holding the
    user data, booted under QEMU (TCG: KVM does not boot here, docs/machine.md), its serial
    console in `work/console.log`. forwards: guest port on 10.0.2.100 -> host loopback port."""

    def __init__(self, rootfs: Path, work: Path, user_data: str, *, forwards: dict[int, int],
                 gpu_hook: bool = True, instance_id: str = "i-vmcheck", memory_mb: int = 2048,
                 imds_port: int | None = None) -> None:
        """imds_port: the user data comes from an instance metadata service on this loopback port
        (tools/vm/imds.py), read by cloud-init's Ec2 datasource at 169.254.169.254, instead of a NoCloud seed."""
        self.rootfs, self.work, self.user_data = rootfs, work, user_data
        self.forwards, self.gpu_hook, self.instance_id, self.memory_mb = forwards, gpu_hook, instance_id, memory_mb
        self.imds_port = imds_port
        self.console_path = work / "console.log"
        self.disk = work / "disk.img"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.boots = 0

    def _make_disk(self) -> None:
        root = self.work / "root"
        if root.exists():
            shutil.rmtree(root)
        # Hard links: a case's tree costs no copy; every file a case writes is new (never written through).
        subprocess.run(["cp", "-al", str(self.rootfs), str(root)], check=True)
        if self.imds_port is None:
            seed = root / "var/lib/cloud/seed/nocloud"
            seed.mkdir(parents=True, exist_ok=True)
            (seed / "user-data").write_text(self.user_data)
            (seed / "meta-data").write_text(f"instance-id: {self.instance_id}\nlocal-hostname: tensorant-vm\n")
            (root / "etc/cloud/cloud.cfg.d/95-tensorant-vm.cfg").write_text("datasource_list: [ NoCloud, None ]\n")
        else:
            # As an EC2 AMI has it: the Ec2 datasource alone. The machine's DMI says EC2 (start(): system uuid
            # and serial "ec2..."), so cloud-init takes it for AWS and asks for an IMDSv2 token (on a platform
            # it does not know it reads IMDSv1 only, which EC2 refuses under HttpTokens=required). eth0 is the
            # metadata service's network, as on EC2 (cloud-init brings it up); eth1 reaches 10.0.2.100.
            (root / "etc/cloud/cloud.cfg.d/95-tensorant-vm.cfg").write_text(
                "datasource_list: [ Ec2, None ]\ndatasource:\n  Ec2:\n"
                "    metadata_urls: [ 'http://169.254.169.254' ]\n")
            (root / "etc/network/interfaces.d/eth1-host").write_text("auto eth1\niface eth1 inet dhcp\n")
        if self.gpu_hook:  # a GPU host's NVIDIA container toolkit, without the GPU (tools/vm/build.sh)
            (root / "usr/local/bin/nvidia-container-runtime-hook").symlink_to(HOOK)
        button = root / "usr/local/lib/tensorant-vm/power-button"
        button.write_text(POWER_BUTTON)
        button.chmod(0o755)
        units = root / "etc/systemd/system"
        (units / "vm-check-power.service").write_text(POWER_UNIT)
        (units / "multi-user.target.wants/vm-check-power.service").symlink_to("/etc/systemd/system/vm-check-power.service")
        (units / f"{UNIT}.d").mkdir()
        (units / f"{UNIT}.d/vm-check-console.conf").write_text(CONSOLE_DROP_IN)
        self.disk.unlink(missing_ok=True)
        subprocess.run(["truncate", "-s", DISK_SIZE, str(self.disk)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(root), str(self.disk)], check=True)
        shutil.rmtree(root)

    def start(self, fresh: bool = True) -> Vm:
        """Boot: a fresh disk (the machine's first boot), or the disk as the last boot left it (fresh=False:
        the cloud started the stopped machine again). Each boot's console is kept: console.log is the
        current one, console-<n>.log the earlier ones."""
        self.work.mkdir(parents=True, exist_ok=True)
        if fresh or not self.disk.exists():
            self._make_disk()
        if self.boots and self.console_path.exists():
            self.console_path.rename(self.work / f"console-{self.boots}.log")
        self.boots += 1
        control = self.work / "ctl"
        for end in ("in", "out"):
            pipe = Path(f"{control}.{end}")
            pipe.unlink(missing_ok=True)
            os.mkfifo(pipe)
        forwards = []
        for guest, host in self.forwards.items():
            relay = self.work / f"relay-{guest}.sh"  # a file: a comma in guestfwd's cmd breaks QEMU's parser
            relay.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'relay.py'} {host}\n")
            relay.chmod(0o755)
            forwards.append(f"guestfwd=tcp:{GUEST_HOST}:{guest}-cmd:{relay}")
        network = ["-netdev", ",".join(["user,id=n0,restrict=on", *forwards]), "-device", "virtio-net-pci,netdev=n0"]
        if self.imds_port is not None:
            # 169.254.169.254 as on EC2: QEMU forwards a guest address only inside its user network, so the
            # metadata service has its own NIC on 169.254.0.0/16, the first (eth0, cloud-init's fallback
            # interface, where its init-local stage looks for EC2's metadata service).
            relay = self.work / "relay-imds.sh"
            relay.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'relay.py'} {self.imds_port}\n")
            relay.chmod(0o755)
            network = ["-netdev", "user,id=n1,restrict=on,net=169.254.0.0/16,host=169.254.0.2,dhcpstart=169.254.0.15,"
                       f"guestfwd=tcp:169.254.169.254:80-cmd:{relay}", "-device", "virtio-net-pci,netdev=n1",
                       # EC2's DMI as cloud-init identifies it (DataSourceEc2.identify_aws): uuid "ec2..." = serial.
                       "-smbios", f"type=1,manufacturer=Amazon EC2,product=g6.xlarge,uuid={EC2_UUID},serial={EC2_UUID}",
                       *network]
        boot = self.rootfs / "boot"
        kernel = sorted(boot.glob("vmlinuz-*"))[-1]
        initrd = sorted(boot.glob("initrd.img-*"))[-1]
        command = [
            "qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", str(self.memory_mb), "-smp", "2",
            "-nographic", "-nodefaults", "-no-reboot", "-serial", f"file:{self.console_path}",
            "-serial", f"pipe:{control}",  # ttyS1: the power button (POWER_BUTTON)
            "-kernel", str(kernel), "-initrd", str(initrd),
            "-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0",
            "-drive", f"file={self.disk},format=raw,if=virtio",
            *network,
            "-pidfile", str(self.work / "qemu.pid"),  # tools/vm/check.sh kills any left
        ]
        self.console_path.write_text("")
        with open(self.work / "qemu.log", "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
        self.started_at = time.monotonic()
        return self

    def console(self) -> str:
        return self.console_path.read_text(errors="replace") if self.console_path.exists() else ""

    def uptime(self) -> float:
        return time.monotonic() - self.started_at if self.started_at else 0.0

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def shutdown(self, timeout: float = 300) -> bool:
        """Stop the machine as a cloud stops it, disk kept: the guest is asked to shut down cleanly (systemd
        stops its units: the training unit's ExecStop) and QEMU ends with its poweroff. Past `timeout` it is
        killed, as a cloud forces a stop. Returns whether the guest shut down by itself."""
        if not self.running():
            return False
        try:
            fd = os.open(self.work / "ctl.in", os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, b"poweroff\n")
            finally:
                os.close(fd)
        except OSError:
            pass
        assert self.proc is not None
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            return False

    def kill(self) -> None:
        """Pulled the plug: QEMU killed, the disk kept as it was."""
        if self.proc is not None:
            _kill(self.proc)

    def stop(self) -> None:
        """Power off (the cloud deleted the machine): QEMU killed, the disk removed."""
        if self.proc is not None:
            _kill(self.proc)
        self.disk.unlink(missing_ok=True)


@contextmanager
def proxied(proxy: HostProxy) -> Iterator[None]:
    """The host's HTTP clients through `proxy` for 10.0.2.100 (loopback still direct)."""
    saved = {k: os.environ.get(k) for k in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")}
    for key in ("HTTP_PROXY", "http_proxy"):
        os.environ[key] = proxy.url
    for key in ("NO_PROXY", "no_proxy"):
        os.environ[key] = "127.0.0.1,localhost,::1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
