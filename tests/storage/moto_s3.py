"""moto in server mode on a free loopback port, plus an independent SigV4 check of presigned URLs.

moto serves presigned URLs without verifying their signatures, so tests that claim a URL
is limited to one key and method recompute the AWS SigV4 query signature here (from the
published algorithm, not botocore) and compare.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote, urlsplit

if TYPE_CHECKING:
    from moto.server import ThreadedMotoServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_moto() -> tuple[ThreadedMotoServer, str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}"


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def presigned_signature_valid(url: str, method: str, secret: str) -> bool:
    """True when url's X-Amz-Signature is the SigV4 signature of (method, path, query, host)."""
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    given = dict(params).get("X-Amz-Signature", "")
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params) if k != "X-Amz-Signature")
    canonical = "\n".join([method, parts.path, canonical_query, f"host:{parts.netloc}\n", "host", "UNSIGNED-PAYLOAD"])
    q = dict(params)
    amz_date = q["X-Amz-Date"]
    scope = q["X-Amz-Credential"].split("/", 1)[1]
    date, region, service, _ = scope.split("/")
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret}".encode(), date), region), service), "aws4_request")
    return hmac.compare_digest(hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), given)


def start_moto_with_auth(no_auth_actions: int) -> tuple[subprocess.Popen[bytes], str]:
    """moto server in its own process with IAM auth enforced after `no_auth_actions` requests
    (the setting is process-wide, so it must not leak into other tests' moto)."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(no_auth_actions)}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("moto server did not start")
