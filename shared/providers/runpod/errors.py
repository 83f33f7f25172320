"""Translate RunPod answers (GraphQL error messages, HTTP statuses) into shared.errors.

RunPod's GraphQL errors carry only a message, so the message is classified by pattern;
an unknown message is retryable (the step retries, then its deadline decides). A message in which
RunPod's schema refuses the request is read first: it names a field, and a field's name may hold any
word the other patterns look for ("clientBalance", "permissions").
"""

from __future__ import annotations

import re

from shared.errors import (
    AuthError,
    CapacityError,
    PermanentError,
    ProviderError,
    RetryableError,
    ThrottledError,
)

AUTH_HINT = (
    "Replace the key on the RunPod card in Settings → Connections with a RunPod API key (Restricted, "
    "read/write access to pods). The S3 API key of a network volume is a different key and does not work here."
)


class RunPodNotFound(PermanentError):
    """RunPod says the pod (or other object) does not exist."""


_NOT_FOUND = re.compile(r"not found|does not exist|no pod with", re.I)
_AUTH = re.compile(r"unauthori[sz]ed|not authori[sz]ed|forbidden|permission|invalid api key|access denied", re.I)
_CAPACITY = re.compile(
    r"no longer any instances available|not have the resources|not enough free gpu|no instances? available"
    r"|insufficient capacity|no available",
    re.I,
)
_FUNDS = re.compile(r"balance|insufficient funds|not enough funds|credit", re.I)
_THROTTLED = re.compile(r"rate limit|too many requests", re.I)
# A request whose shape the API does not accept never passes by retrying (it was retried until the
# deadline): "Field \"x\" is not defined by type \"PodFindAndDeployOnDemandInput\"" is graphql-js's wording.
_SCHEMA = re.compile(r"cannot query field|unknown argument|unknown type|expected type|variable \"\$|syntax error"
                     r"|is not defined by type|got invalid value|must not be null|cannot represent", re.I)

# Each refusal kind of shared.providers.base.ERROR_KINDS -> what RunPod answers for it: a GraphQL error's message
# as RunPod words it (its errors carry no code), or an HTTP status written "HTTP <status>".
ERROR_TABLE: dict[str, frozenset[str]] = {
    "capacity": frozenset({"There are no longer any instances available with the requested specifications. "
                           "Please refresh and try again.",
                           "This machine does not have the resources to deploy your pod. Please try a different "
                           "machine."}),
    "auth": frozenset({"You are not authorized to perform this action", "HTTP 401", "HTTP 403"}),
    "not_found": frozenset({"Pod not found"}),
    "throttled": frozenset({"HTTP 429", "Too many requests, rate limit exceeded"}),
}
ABSENT_KINDS = {"quota": "RunPod has no per-account GPU quota: an account is bounded by its credit balance, "
                         "refused as `funds` (add credit), and its stock, refused as capacity"}


def translate(message: str) -> ProviderError:
    """One GraphQL error message -> the error tree. Unknown messages are retryable."""
    text = f"RunPod: {message}"
    if _SCHEMA.search(message):
        return PermanentError(
            f"RunPod's API refused the shape of Tensorant's request: {message} Retrying cannot change that; "
            "RunPod's API has changed or Tensorant sends a field it does not define (report it with this message).",
            code="schema")
    if _NOT_FOUND.search(message):
        return RunPodNotFound(text, code="not_found")
    if _AUTH.search(message):
        return AuthError(f"RunPod refused the API key ({message}). {AUTH_HINT}", code="auth")
    if _CAPACITY.search(message):
        return CapacityError(text, code="capacity")
    if _FUNDS.search(message):
        return PermanentError(f"{text}. Add credit in RunPod Billing, then try again.", code="funds")
    if _THROTTLED.search(message):
        return ThrottledError(text, code="throttled", retry_after_s=30.0)
    return RetryableError(text, code="graphql", retry_after_s=30.0)


def from_status(status: int, body: str) -> ProviderError | None:
    if status in (401, 403):
        return AuthError(f"RunPod refused the API key (HTTP {status}). {AUTH_HINT}", code="auth")
    if status == 429:
        return ThrottledError("RunPod is throttling requests (HTTP 429)", code="throttled", retry_after_s=60.0)
    if status >= 500:
        return RetryableError(f"RunPod API error (HTTP {status})", code=f"http_{status}")
    if status >= 400:
        return PermanentError(f"RunPod API refused the request (HTTP {status}): {body[:200]}", code=f"http_{status}")
    return None
