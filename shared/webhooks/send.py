"""One signed POST of a webhook body to an endpoint, behind the same guard as custom S3 endpoints.

- Signed by the Standard Webhooks specification with its reference implementation (the `standardwebhooks`
  package): `webhook-id`, `webhook-timestamp`, `webhook-signature` (`v1,<base64 HMAC-SHA256 of
  id.timestamp.body>`); during a rotation's grace both secrets sign, space-separated, as the spec allows.
  The timestamp is the wall clock at the attempt (what the receiver compares with its own clock).
- The URL is checked at every attempt (https only, every address the host resolves to public) and the
  connection goes to the address checked (no second lookup a rebinding DNS could answer differently); a
  redirect is never followed (a 3xx is a failed attempt).
- TIMEOUT_S for the whole request; the response body is not read past MAX_RESPONSE_BYTES.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from shared.org_storage.endpoint_guard import EndpointRefused, resolve_checked, split_endpoint, system_resolver
from shared.settings import get_settings

TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 4096
USER_AGENT = "tensorant-webhooks/1"


@dataclass(frozen=True)
class Result:
    ok: bool
    status_code: int | None
    error: str
    duration_ms: int


def signature(secrets: list[str], webhook_id: str, at: datetime, body: str) -> str:
    from standardwebhooks import Webhook

    return " ".join(Webhook(s).sign(webhook_id, at, body) for s in secrets)


def allow_private() -> bool:
    return get_settings().allow_private_endpoints  # test-only (a receiver on loopback http)


def check_url(url: str, *, resolver: Any = None) -> None:
    """Raises EndpointRefused unless `url` may receive webhooks now."""
    _, host, port = split_endpoint(url, allow_private=allow_private())
    resolve_checked(host, port, allow_private=allow_private(), resolver=resolver or system_resolver)


def _pool(scheme: str, host: str, ip: str, port: int) -> Any:
    """One connection to the address the endpoint guard checked; https verifies the certificate for host."""
    import urllib3

    timeout = urllib3.Timeout(total=TIMEOUT_S)
    if scheme == "https":
        import certifi

        return urllib3.HTTPSConnectionPool(ip, port, timeout=timeout, maxsize=1, retries=False,
                                           cert_reqs="CERT_REQUIRED", ca_certs=certifi.where(),
                                           server_hostname=host, assert_hostname=host)
    return urllib3.HTTPConnectionPool(ip, port, timeout=timeout, maxsize=1, retries=False)


def post(url: str, webhook_id: str, body: str, secrets: list[str], *, resolver: Any = None) -> Result:
    import urllib3

    start = time.monotonic()

    def done(ok: bool, code: int | None, error: str) -> Result:
        return Result(ok, code, error, int((time.monotonic() - start) * 1000))

    private = allow_private()
    try:
        scheme, host, port = split_endpoint(url, allow_private=private)
        ip = resolve_checked(host, port, allow_private=private, resolver=resolver or system_resolver)
    except EndpointRefused as exc:
        return done(False, None, f"refused: {exc}")
    at = datetime.fromtimestamp(int(time.time()), tz=UTC)
    parts = urlsplit(url)
    headers = {"content-type": "application/json", "user-agent": USER_AGENT, "host": parts.netloc,
               "webhook-id": webhook_id, "webhook-timestamp": str(int(at.timestamp())),
               "webhook-signature": signature(secrets, webhook_id, at, body)}
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    pool = _pool(scheme, host, ip, port)
    try:
        resp = pool.urlopen("POST", target, body=body.encode(), headers=headers, redirect=False, retries=False,
                            preload_content=False, assert_same_host=False, decode_content=False)
        try:
            resp.read(MAX_RESPONSE_BYTES)  # drained up to the bound only; the connection is closed below
        finally:
            resp.release_conn()
            pool.close()
    except urllib3.exceptions.TimeoutError:
        return done(False, None, f"timed out after {TIMEOUT_S:g} s")
    except urllib3.exceptions.HTTPError as exc:
        return done(False, None, f"could not connect: {type(exc).__name__}")
    code = int(resp.status)
    if 200 <= code < 300:
        return done(True, code, "")
    if 300 <= code < 400:
        return done(False, code, "redirects are not followed: point the webhook at its final https URL")
    return done(False, code, f"HTTP {code}")
