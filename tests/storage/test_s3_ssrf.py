"""A custom S3 endpoint cannot reach the control plane's own network.

https only; every resolved address must be public, in every spelling; the connection goes to
the checked address; one message for every way an endpoint is unreachable; a strict region."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator

import boto3
import pytest
from pydantic import SecretStr, ValidationError

from shared.models import CheckStatus
from shared.org_storage.config import S3StorageConfig
from shared.org_storage.endpoint_guard import EndpointRefused, is_public, resolve_checked, split_endpoint
from shared.org_storage.s3 import S3Storage
from shared.settings import reset_settings
from tests.storage.moto_s3 import free_port, start_moto

# Spellings of non-public addresses; getaddrinfo turns the numeric ones into 127.0.0.1 etc.
BLOCKED_HOSTS = [
    "127.0.0.1", "localhost", "2130706433", "0x7f.1", "017700000001", "0x7f000001", "127.1", "0177.0.0.1",
    "::1", "::ffff:127.0.0.1", "::ffff:7f00:1", "::127.0.0.1", "169.254.169.254", "0xa9fea9fe", "10.0.0.1",
    "172.16.0.1", "192.168.1.1", "100.64.0.1", "fe80::1", "fc00::1", "224.0.0.1", "ff02::1", "0.0.0.0", "::",
    "240.0.0.1", "255.255.255.255", "2002:7f00:1::", "198.18.0.1",
    # Azure's WireServer and IPv6 site-local: "global" by the registry, never a tenant's endpoint.
    "168.63.129.16", "::ffff:168.63.129.16", "0xa83f8110", "fec0::1", "feff:ffff::1",
]


@pytest.fixture
def production_rules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "0")
    reset_settings()
    yield
    reset_settings()


def config(endpoint: str = "https://s3.example.com", **over: object) -> S3StorageConfig:
    values: dict[str, object] = {"endpoint": endpoint, "region": "us-east-1", "bucket": "b-ssrf",
                                 "access_key_id": "AKIASSRF0000", "secret_access_key": SecretStr("x" * 40), **over}
    return S3StorageConfig.model_validate(values)


@pytest.mark.parametrize("host", BLOCKED_HOSTS)
def test_every_spelling_of_a_private_address_is_refused(host: str) -> None:
    with pytest.raises(EndpointRefused):
        resolve_checked(host, 443, allow_private=False)


def test_public_addresses_pass() -> None:
    for ip in ("52.216.1.1", "2600:1f18::1", "::ffff:52.216.1.1", "8.8.8.8"):
        assert is_public(ip), ip
    assert resolve_checked("s3.test", 443, allow_private=False, resolver=lambda h, p: ["52.216.1.1"]) == "52.216.1.1"


def test_a_host_with_any_private_answer_is_refused() -> None:
    with pytest.raises(EndpointRefused):
        resolve_checked("rebind.test", 443, allow_private=False, resolver=lambda h, p: ["52.216.1.1", "127.0.0.1"])


def test_endpoint_must_be_https(production_rules: None) -> None:
    with pytest.raises(ValidationError, match="https"):
        config("http://s3.example.com")
    with pytest.raises(EndpointRefused):
        split_endpoint("http://s3.example.com", allow_private=False)
    assert config("https://s3.example.com:8443").endpoint == "https://s3.example.com:8443"


@pytest.mark.parametrize("region", ["us-east-1.evil.com", "us-east-1/x", "a b", "x@y", "us-east-1#", "-x", "é"])
def test_region_has_a_strict_pattern(region: str) -> None:
    with pytest.raises(ValidationError):
        config("", region=region)
    config("", region="eu-central-1")
    config("", region="EU-RO-1")


class CountingServer:
    """A loopback TCP server that counts connections and closes them (not S3)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def test_probe_never_connects_to_a_private_address(production_rules: None) -> None:
    server = CountingServer()
    try:
        for host in ("127.0.0.1", "2130706433", "0x7f.1", "localhost"):
            s = S3Storage(config(), endpoint=f"https://{host}:{server.port}")
            checks = s.validate()
            assert checks[0].status == CheckStatus.fail
            assert "private, loopback and link-local addresses are refused" in checks[0].message
        assert server.accepted == 0
    finally:
        server.close()


def test_unreachable_messages_are_uniform(production_rules: None) -> None:
    """Closed port, open non-S3 port and blocked address read the same: no port-scan oracle."""
    server = CountingServer()
    try:
        def message(port: int, allow: bool) -> str:
            s = S3Storage(config(), endpoint=f"http://127.0.0.1:{port}", allow_private=allow)
            text = s.validate()[0].message.replace(f":{port}", ":PORT")
            return re.sub(r"tensorant-probe/[0-9a-f]+", "tensorant-probe/KEY", text)

        open_port, closed_port = message(server.port, True), message(free_port(), True)
        blocked = message(server.port, False)
        assert open_port == closed_port == blocked
        assert "Errno" not in open_port and "Connection" not in open_port
    finally:
        server.close()


def test_connection_goes_to_the_checked_address() -> None:
    """The host name never resolves through DNS: the request reaches moto only because the
    sender connects to the address the check returned, with the original Host header."""
    server, url = start_moto()
    try:
        port = int(url.rsplit(":", 1)[1])
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="AKIAROOT0000",
                     aws_secret_access_key="x" * 40).create_bucket(Bucket="b-ssrf")
        asked: list[str] = []

        def resolver(host: str, p: int) -> list[str]:
            asked.append(host)
            return ["127.0.0.1"]

        s = S3Storage(config(), endpoint=f"http://tensorant-pinned-test-host:{port}", resolver=resolver, allow_private=True)
        s.put("k/one", b"pinned")
        assert s.get("k/one", 100) == b"pinned"
        assert asked and set(asked) == {"tensorant-pinned-test-host"}
        # The same storage refuses once the resolver answers with a private address under production rules.
        refused = S3Storage(config(), endpoint=f"http://tensorant-pinned-test-host:{port}", resolver=resolver,
                            allow_private=False)
        assert refused.validate()[0].status == CheckStatus.fail
    finally:
        server.stop()
