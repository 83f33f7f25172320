"""The bootstrap's systemd unit, played by tests/machine.py against a small claim server (no Azurite, no
agent): cloud-init's runcmd only enables and starts tensorant-run.service; the unit runs the script once
runcmd is done; the container's output goes to the journal (the machine's console here) and only its last
lines to the bootstrap log; a later boot starts the enabled unit again without a second claim or pull.
(tests/e2e/ drives the same user data through the control plane to each end state.)"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from shared.providers import cloudinit
from shared.providers.base import Bootstrap
from tests.machine import LedgerClock, Machine, wait_for

RUN_ID = "r-0123456789ab"
CLAIM = f"tcl1.org-a.{RUN_ID}." + "a" * 64


class ClaimServer:
    """Answers the claim's exchange (once, as the control plane does) and records every request."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.posts.append((self.path, body))
                claims = [p for p, _ in server.posts if p.endswith("/bootstrap")]
                if self.path.endswith("/bootstrap") and len(claims) > 1:
                    self.send_response(409)  # the claim is dead after its first exchange
                    self.end_headers()
                    return
                env = {"TENSORANT_RUN_ID": RUN_ID}
                answer = json.dumps({"bootstrap": base64.b64encode(json.dumps(env).encode()).decode(),
                                     "token": "tok.en-1"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def count(self, what: str) -> int:
        return sum(1 for path, _ in self.posts if path.endswith(f"/{what}"))


@pytest.fixture
def plane() -> Iterator[ClaimServer]:
    server = ClaimServer()
    yield server
    server.httpd.shutdown()


def _user_data(plane: ClaimServer) -> str:
    return cloudinit.render(Bootstrap(container_image="ghcr.io/tensorant/trainer:vm",
                                      env={"TENSORANT_RUN_ID": RUN_ID, "TENSORANT_API_URL": plane.url}), CLAIM)


def _machine(tmp_path: Path, **shim: str) -> Machine:
    return Machine(tmp_path / "vm", LedgerClock(1_800_000_000.0, tmp_path / "slept"), **shim)


def _ended(machine: Machine) -> int:
    wait_for(lambda: machine.exited() is not None, "the machine's unit to end", 60, machine=machine)
    return int(machine.exited() or 0)


def test_runcmd_starts_the_unit_whose_container_output_goes_to_the_journal(plane: ClaimServer,
                                                                           tmp_path: Path) -> None:
    machine = _machine(tmp_path, run="exit:3")
    machine.boot(_user_data(plane))
    assert _ended(machine) == 3
    assert machine.systemctl_calls() == [["daemon-reload"], ["enable", cloudinit.UNIT_NAME],
                                         ["start", "--no-block", cloudinit.UNIT_NAME]]
    assert [c[0] for c in machine.docker_calls()] == ["pull", "rm", "run"]
    console = machine.console()  # the unit's output: the journal on a real machine
    assert all(f"container line {k}\n" in console for k in range(1, 51)), console[-2000:]
    # The bootstrap log keeps the script's own lines and the container's last 20, not all it printed.
    log = machine.path(cloudinit.BOOT_LOG).read_text()
    assert "container line 31\n" in log and "container line 50\n" in log and "container line 30\n" not in log, log
    # The agent never ran (no state file): the machine reports the failed start with those last lines.
    [(_, report)] = [(p, b) for p, b in plane.posts if p.endswith("/boot-failed")]
    assert (report["stage"], report["exit_code"]) == ("agent", 3)
    assert "container line 50" in report["last_lines"] and "container line 1" not in report["last_lines"]


def test_a_later_boot_starts_the_enabled_unit_again_without_a_second_claim_or_pull(plane: ClaimServer,
                                                                                 tmp_path: Path) -> None:
    machine = _machine(tmp_path, run="exit:0")
    machine.boot(_user_data(plane))
    assert _ended(machine) == 0
    assert (plane.count("bootstrap"), [c[0] for c in machine.docker_calls()]) == (1, ["pull", "rm", "run"])
    enabled = machine.path(f"/etc/systemd/system/multi-user.target.wants/{cloudinit.UNIT_NAME}")
    assert enabled.is_symlink(), "systemctl enable links the unit into multi-user.target's wants"

    machine.boot_again()  # the cloud started the stopped machine: cloud-init's runcmd does not run again
    assert _ended(machine) == 0
    assert len(machine.systemctl_calls()) == 3  # runcmd's three calls, at the first boot only
    # The environment is on the disk: no second exchange (it would be refused and recorded on the run). The
    # image pulled at the first boot is not pulled again: the container runs again on the kept disk.
    assert (plane.count("bootstrap"), [c[0] for c in machine.docker_calls()]) == (1, ["pull", "rm", "run", "rm", "run"])
    assert "was pulled on an earlier boot of this machine; not pulled again" in machine.console()
    assert plane.count("boot-failed") == 0


def test_an_unplayable_unit_is_refused_by_the_shim(tmp_path: Path) -> None:
    """The systemctl shim plays only what it knows: a unit needing more (a user, a restart policy) fails at
    daemon-reload instead of running as if systemd had honoured it."""
    from tests.systemd_shim import Refused, parse

    unit = tmp_path / cloudinit.UNIT_NAME
    for old, new in (("[Service]\n", "[Service]\nUser=trainer\n"), ("Restart=no", "Restart=always")):
        assert old in cloudinit.unit()
        unit.write_text(cloudinit.unit().replace(old, new))
        with pytest.raises(Refused):
            parse(unit)
    unit.write_text(cloudinit.unit())
    parse(unit)
