"""Base models named by Hub id and revision (a run's base_model with base_model_revision).

At create the revision is pinned to a commit id (a branch or tag is resolved once through
`/api/models/{id}/revision/{rev}` and the commit id recorded), then `config.json` and the checkpoint's
parameter count (model.safetensors.index.json's total_size, else model.safetensors' header) are read once per
org, id and commit from `{hf_endpoint}/{id}/resolve/{commit}/...` with the org's Hugging Face token, and the
shapes derived from them (adapter_format/hub_config.py) are kept in store.hub_models. The fit, the forecast and
the verifier read that record as they read a declared model; the machine loads the same commit
(TENSORANT_BASE_MODEL_REVISION).

Every request goes through the endpoint guard (shared/org_storage/endpoint_guard.py): https to a public
address, pinned to the checked address; http to loopback only under the test-only
TENSORANT_ALLOW_PRIVATE_ENDPOINTS. A redirect is followed (the hub sends large files to its CDN) only to
another guarded URL, at most twice. Responses are read up to a bound.
"""

from __future__ import annotations

import json
import re
import struct
import time
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

from adapter_format.base_models import DeclaredModel
from adapter_format.hub_config import (
    ConfigRefused,
    dtype_of,
    model_from_config,
    params_from_header,
    params_from_index,
)
from shared.clock import now
from shared.context import Context
from shared.errors import InvalidInput
from shared.org_storage.endpoint_guard import EndpointRefused, resolve_checked, split_endpoint, system_resolver
from shared.webhooks.send import allow_private

COMMIT = re.compile(r"^[0-9a-f]{40}$")
TIMEOUT_S = 5.0  # one request
HUB_READ_S = 20.0  # every request of one create together (as a cloud wait inline: budget.LRO_WAIT_S)
MAX_JSON_BYTES = 4 * 1024 * 1024  # a config is a few kB; an index of a 400B model is ~100 kB
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_REDIRECTS = 2


class HubError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _fetch(url: str, token: str, *, limit: int, deadline: float, byte_range: str = "") -> bytes:
    """GET url through the endpoint guard; HubError with the status (0: unreachable) otherwise."""
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        headers = {"host": parts.netloc, "user-agent": "tensorant-control-plane"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        if byte_range:
            headers["range"] = byte_range
        status, location, body = _get_once(url, headers, limit, deadline)
        if status in (301, 302, 303, 307, 308) and location:
            # The CDN's signed URL carries no token: a token goes to the hub's own host only.
            nxt = urljoin(url, location)
            if urlsplit(nxt).netloc != parts.netloc:
                token = ""
            url = nxt
            continue
        if status not in (200, 206):
            raise HubError(status, f"HTTP {status}")
        if len(body) > limit:
            raise HubError(413, f"more than {limit} bytes")
        return bytes(body)
    raise HubError(310, "too many redirects")


def _get_once(url: str, headers: dict[str, str], limit: int, deadline: float) -> tuple[int, str, bytes]:
    """One GET, no redirect followed: its status, its Location header ("" when none), and at most limit + 1
    bytes of its body."""
    import urllib3

    pool = _pool(url, deadline)
    parts = urlsplit(url)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        resp = pool.urlopen("GET", target, headers=headers, redirect=False, retries=False,
                            preload_content=False, assert_same_host=False)
        try:
            body = resp.read(limit + 1)
        finally:
            resp.release_conn()
            pool.close()
    except urllib3.exceptions.HTTPError as exc:
        raise HubError(0, f"could not reach the hub ({type(exc).__name__})") from exc
    return int(resp.status), resp.headers.get("location") or "", body


def _pool(url: str, deadline: float) -> Any:
    """A one-connection pool to the address the endpoint guard resolved and checked for url's host, within
    what is left of the deadline."""
    import urllib3

    private = allow_private()
    try:
        scheme, host, port = split_endpoint(url, allow_private=private)
        ip = resolve_checked(host, port, allow_private=private, resolver=system_resolver)
    except EndpointRefused as exc:
        raise HubError(-1, f"{url.split('?')[0][:120]} is refused: {exc}") from exc
    left = deadline - time.monotonic()
    if left <= 0:
        raise HubError(0, f"the hub took more than {HUB_READ_S:g} s")
    timeout = urllib3.Timeout(total=min(TIMEOUT_S, left))
    if scheme == "https":
        import certifi

        return urllib3.HTTPSConnectionPool(ip, port, timeout=timeout, maxsize=1, retries=False,
                                           cert_reqs="CERT_REQUIRED", ca_certs=certifi.where(),
                                           server_hostname=host, assert_hostname=host)
    return urllib3.HTTPConnectionPool(ip, port, timeout=timeout, maxsize=1, retries=False)


def _json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ConfigRefused(f"{what} is not JSON") from exc


def _refusal(model_id: str, revision: str, what: str, exc: HubError) -> InvalidInput:
    if exc.status in (401, 403):
        fix = ("the model is gated or private (or the saved token has no access to it): an owner saves a Hugging Face "
               "token with access to it (PUT /api/org/secrets/huggingface-token), after accepting the model's terms "
               "on the hub")
    elif exc.status == 404:
        fix = "check the id and the revision (a commit id, branch or tag that exists on the hub)"
    elif exc.status == -1:
        fix = (f"the hub endpoint is refused ({exc}); the operator sets TENSORANT_HF_ENDPOINT to the hub's public "
               "https URL")
    else:
        fix = f"the hub did not answer ({exc}); try again later"
    return InvalidInput.field("base_model", f"cannot read {what} of {model_id} at {revision}: {fix}")


def _url(ctx: Context, model_id: str, revision: str, path: str) -> str:
    base = ctx.settings.hf_endpoint.rstrip("/")
    return f"{base}/{model_id}/resolve/{quote(revision, safe='')}/{path}"


def pin(ctx: Context, model_id: str, revision: str, token: str, deadline: float) -> str:
    """The commit id of a revision (a commit id as it is)."""
    if COMMIT.fullmatch(revision):
        return revision

    url = f"{ctx.settings.hf_endpoint.rstrip('/')}/api/models/{model_id}/revision/{quote(revision, safe='')}"
    try:
        info = _json(_fetch(url, token, limit=MAX_JSON_BYTES, deadline=deadline), "the hub's model info")
    except HubError as exc:
        raise _refusal(model_id, revision, "the revision", exc) from exc
    except ConfigRefused as exc:
        raise InvalidInput.field("base_model_revision", f"{revision}: {exc}") from exc
    sha = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise InvalidInput.field("base_model_revision", f"the hub names no commit id for {model_id} at {revision}; "
                                 "give the commit id (40 hex digits)")
    return sha


def _params(ctx: Context, model_id: str, sha: str, token: str, dtype: str, deadline: float) -> int:
    """The checkpoint's own parameter count; 0 when it has neither an index nor a single safetensors file."""
    try:
        index = _json(_fetch(_url(ctx, model_id, sha, "model.safetensors.index.json"), token, limit=MAX_JSON_BYTES,
                             deadline=deadline), "model.safetensors.index.json")
        return params_from_index(index, dtype)
    except HubError as exc:
        if exc.status != 404:
            raise
    try:
        head = _fetch(_url(ctx, model_id, sha, "model.safetensors"), token, limit=8, deadline=deadline,
                      byte_range="bytes=0-7")
        (size,) = struct.unpack("<Q", head[:8])
        if not 2 <= size <= MAX_HEADER_BYTES:
            return 0
        header = _fetch(_url(ctx, model_id, sha, "model.safetensors"), token, limit=size, deadline=deadline,
                        byte_range=f"bytes=8-{7 + size}")
        return params_from_header(_json(header, "model.safetensors' header"))
    except HubError as exc:
        if exc.status != 404:
            raise
    except struct.error:
        return 0
    return 0


def resolve(ctx: Context, org: str, model_id: str, revision: str, token: str) -> tuple[DeclaredModel, str]:
    """(the model's shapes, its commit id), read from the hub once per org, id and commit with the org's
    Hugging Face token ("": none); 422 when refused."""
    deadline = time.monotonic() + HUB_READ_S
    sha = pin(ctx, model_id, revision, token, deadline)
    store = ctx.store.hub_models
    kept = store.get(org, model_id, sha)
    if kept is not None:
        return kept[0], sha
    try:
        config = _json(_fetch(_url(ctx, model_id, sha, "config.json"), token, limit=MAX_JSON_BYTES, deadline=deadline),
                       "config.json")
        model_from_config(model_id, config)  # refused before any more reads: an unsupported architecture
        model = model_from_config(model_id, config, _params(ctx, model_id, sha, token, dtype_of(config), deadline))
    except HubError as exc:
        raise _refusal(model_id, sha, "config.json", exc) from exc
    except ConfigRefused as exc:
        raise InvalidInput.field("base_model", f"{model_id} at {sha}: {exc}") from exc
    store.put(org, model_id, sha, model, requested=revision, dtype=dtype_of(config), read_at=now().isoformat(),
              memory_at_defaults=model.describe())
    return model, sha


def kept(ctx: Context, org: str, model_id: str, revision: str) -> DeclaredModel | None:
    """The shapes kept at create for a run's base model (None: not a Hub model, or no record)."""
    if not revision:
        return None
    got = ctx.store.hub_models.get(org, model_id, revision)
    return got[0] if got else None

