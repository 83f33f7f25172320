"""Start a real Azurite (from node_modules) on free loopback ports for a test session or `make run`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def azurite_bin() -> str:
    from tensorant_devhost.run import azurite_bin

    return azurite_bin(ROOT)


def connection_string(blob: int, queue: int, table: int) -> str:
    return (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{blob}/devstoreaccount1;"
        f"QueueEndpoint=http://127.0.0.1:{queue}/devstoreaccount1;"
        f"TableEndpoint=http://127.0.0.1:{table}/devstoreaccount1;"
    )


class Azurite:
    """persist: keep the data on disk (in the work directory), so a stop and a start on the same
    object is an outage, not a new account."""

    def __init__(self, ports: tuple[int, int, int] | None = None, *, persist: bool = False) -> None:
        self.ports = ports or (free_port(), free_port(), free_port())
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir = tempfile.mkdtemp(prefix="azurite-")
        self.persist = persist

    @property
    def connection_string(self) -> str:
        return connection_string(*self.ports)

    def start(self) -> Azurite:
        blob, queue, table = self.ports
        keep = ["--location", os.path.join(self.workdir, "data")] if self.persist else ["--inMemoryPersistence"]
        cmd = [azurite_bin(), "--silent", "--skipApiVersionCheck", *keep,
               "--blobHost", "127.0.0.1", "--blobPort", str(blob),
               "--queueHost", "127.0.0.1", "--queuePort", str(queue),
               "--tableHost", "127.0.0.1", "--tablePort", str(table)]
        log = open(os.path.join(self.workdir, "azurite.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Azurite exited: see {self.workdir}/azurite.log")
            if all(_listening(p) for p in self.ports):
                return self
            time.sleep(0.1)
        raise RuntimeError("Azurite did not start within 30 s")

    def stop(self, *, keep_data: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # Azurite often ignores SIGTERM; in-memory data needs no clean exit
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not keep_data:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
