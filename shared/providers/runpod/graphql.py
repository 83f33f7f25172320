"""Talking to RunPod's GraphQL API, with vendor errors translated at this boundary.

Two paths, both to `$RUNPOD_API_BASE_URL/graphql` (read on every call, default
https://api.runpod.io) with the API key as a bearer token:

- `sdk(query)`: the `runpod` package's `run_graphql_query`. It sends the query text as
  given, so it is used only for fixed queries and for queries whose one parameter is a
  pod id we checked against POD_ID (the package formats values into GraphQL without
  escaping): account, pod list, pod get, stop, resume, terminate.
- `query(query, variables)`: a small requests client that posts {query, variables}.
  Used wherever a value could carry user text (pod create with name, image and
  environment; GPU prices for a datacenter; network volumes), so no value can change
  the request.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from shared.log import register_secret
from shared.providers.errors import (
    AuthError,
    CapacityError,
    PermanentError,
    ProviderError,
    RetryableError,
    ThrottledError,
)

DEFAULT_BASE_URL = "https://api.runpod.io"
POD_ID = re.compile(r"^[a-z0-9]{6,40}$")
TIMEOUT_S = 30.0

AUTH_HINT = (
    "Replace the key on the RunPod card in Settings → Connections with a RunPod API key (Restricted, "
    "read/write access to pods). The S3 API key of a network volume is a different key and does not work here."
)


class NotFound(PermanentError):
    """RunPod says the pod (or other object) does not exist."""


def base_url() -> str:
    return os.environ.get("RUNPOD_API_BASE_URL", DEFAULT_BASE_URL).rstrip("/")


def check_pod_id(pod_id: str) -> str:
    """Pod ids go into the runpod package's formatted GraphQL: only plain ids pass."""
    if not POD_ID.match(pod_id or ""):
        raise PermanentError(f"{pod_id!r} is not a RunPod pod id", code="bad_pod_id")
    return pod_id


_NOT_FOUND = re.compile(r"not found|does not exist|no pod with", re.I)
_AUTH = re.compile(r"unauthori[sz]ed|not authori[sz]ed|forbidden|permission|invalid api key|access denied", re.I)
_CAPACITY = re.compile(
    r"no longer any instances available|not have the resources|not enough free gpu|no instances? available"
    r"|insufficient capacity|no available",
    re.I,
)
_FUNDS = re.compile(r"balance|insufficient funds|not enough funds|credit", re.I)
_THROTTLED = re.compile(r"rate limit|too many requests", re.I)
_SCHEMA = re.compile(r"cannot query field|unknown argument|unknown type|expected type|variable \"\$|syntax error", re.I)


def translate(message: str) -> ProviderError:
    """One GraphQL error message -> the error tree. Unknown messages are retryable."""
    text = f"RunPod: {message}"
    if _NOT_FOUND.search(message):
        return NotFound(text, code="not_found")
    if _AUTH.search(message):
        return AuthError(f"RunPod refused the API key ({message}). {AUTH_HINT}", code="auth")
    if _CAPACITY.search(message):
        return CapacityError(text, code="capacity")
    if _FUNDS.search(message):
        return PermanentError(f"{text}. Add credit in RunPod Billing, then try again.", code="funds")
    if _THROTTLED.search(message):
        return ThrottledError(text, code="throttled", retry_after_s=30.0)
    if _SCHEMA.search(message):
        return PermanentError(f"{text} (the RunPod API rejected the request's shape)", code="schema")
    return RetryableError(text, code="graphql", retry_after_s=30.0)


def _from_status(status: int, body: str) -> ProviderError | None:
    if status in (401, 403):
        return AuthError(f"RunPod refused the API key (HTTP {status}). {AUTH_HINT}", code="auth")
    if status == 429:
        return ThrottledError("RunPod is throttling requests (HTTP 429)", code="throttled", retry_after_s=60.0)
    if status >= 500:
        return RetryableError(f"RunPod API error (HTTP {status})", code=f"http_{status}")
    if status >= 400:
        return PermanentError(f"RunPod API refused the request (HTTP {status}): {body[:200]}", code=f"http_{status}")
    return None


class RunPodApi:
    def __init__(self, api_key: str) -> None:
        self._key = api_key
        register_secret(api_key)

    def query(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST {query, variables}; returns `data`. Values travel only as variables."""
        import requests

        try:
            resp = requests.post(
                f"{base_url()}/graphql",
                data=json.dumps({"query": query, "variables": variables or {}}),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._key}"},
                timeout=TIMEOUT_S,
            )
        except requests.RequestException as exc:
            raise RetryableError(f"cannot reach the RunPod API: {type(exc).__name__}", code="network") from exc
        err = _from_status(resp.status_code, resp.text)
        if err:
            raise err
        return _data(_json(resp))

    def sdk(self, query: str) -> dict[str, Any]:
        """Run a fixed (or pod-id-only) query through the runpod package; returns `data`."""
        import requests
        from runpod import error as rp_error
        from runpod.api.graphql import run_graphql_query

        try:
            body = run_graphql_query(query, api_key=self._key)
        except rp_error.AuthenticationError as exc:
            raise AuthError(f"RunPod refused the API key (HTTP 401). {AUTH_HINT}", code="auth") from exc
        except rp_error.QueryError as exc:
            raise translate(str(exc.args[0]) if exc.args else "query error") from exc
        except requests.RequestException as exc:
            # Includes a non-JSON answer (a 403/502 page): the package parses before checking.
            raise RetryableError(f"RunPod API call failed: {type(exc).__name__}", code="network") from exc
        except ValueError as exc:
            raise RetryableError("RunPod API answered with something that is not JSON", code="bad_json") from exc
        return _data(body)


def _json(resp: Any) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError as exc:
        raise RetryableError("RunPod API answered with something that is not JSON", code="bad_json") from exc
    if not isinstance(body, dict):
        raise RetryableError("RunPod API answered with an unexpected body", code="bad_json")
    return body


def _data(body: dict[str, Any]) -> dict[str, Any]:
    errors = body.get("errors")
    if errors:
        first = errors[0] if isinstance(errors, list) and errors else {}
        raise translate(str(first.get("message", "unknown error")) if isinstance(first, dict) else str(first))
    data = body.get("data")
    if not isinstance(data, dict):
        raise RetryableError("RunPod API answered without data", code="no_data")
    return data
