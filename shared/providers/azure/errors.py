"""Azure errors -> shared.errors, with reasons a user can act on.

Codes come from the ARM error body ({"error": {"code", "message"}}) of a failed request,
of a failed long-running operation, or of a VM's instance view (ProvisioningFailure).
Only client.py calls the SDK; it passes every failure through translate().
"""

from __future__ import annotations

import re
from typing import Any

from shared.errors import (
    AuthError,
    CapacityError,
    PermanentError,
    ProviderError,
    QuotaError,
    RetryableError,
    ThrottledError,
)
from shared.log import get_logger
from shared.providers.azure import sdk

QUOTA_CODES = {"QuotaExceeded", "LowPriorityQuotaExceeded"}
# OperationNotAllowed is Azure's code for many refusals, quota among them: read by its message.
_QUOTA_MESSAGE = re.compile(r"quota|cores|vcpus?\b|exceeding approved|limit for resource", re.I)
_BUSY_MESSAGE = re.compile(r"marked for deletion|being deleted|is attached|currently attached|in progress", re.I)
AUTH_CODES = {"AuthorizationFailed", "InvalidAuthenticationToken", "InvalidAuthenticationTokenTenant",
              "AuthenticationFailed", "LinkedAuthorizationFailed", "ExpiredAuthenticationToken"}
CAPACITY_CODES = {"AllocationFailed", "OverconstrainedAllocationRequest", "ZonalAllocationFailed",
                  "OverconstrainedZonalAllocationRequest", "SkuNotAvailable"}
NOT_FOUND_CODES = {"ResourceNotFound", "NotFound"}  # HTTP 404
THROTTLE_CODES = {"SubscriptionRequestsThrottled", "TooManyRequests"}  # HTTP 429, with Retry-After
# Each refusal kind of shared.providers.base.ERROR_KINDS -> ARM's codes for it (the contract checks each).
ERROR_TABLE: dict[str, frozenset[str]] = {
    "capacity": frozenset(CAPACITY_CODES), "quota": frozenset(QUOTA_CODES), "auth": frozenset(AUTH_CODES),
    "not_found": frozenset(NOT_FOUND_CODES), "throttled": frozenset(THROTTLE_CODES),
}


def error_code(err: Any) -> str:
    inner = getattr(err, "error", None)
    code = getattr(inner, "code", None) if inner is not None else None
    if code:
        return str(code)
    resp = getattr(err, "response", None)
    if resp is not None:
        try:
            body = resp.json()
            return str((body.get("error") or {}).get("code") or "")
        except Exception:
            return ""
    return ""


def error_message(err: Any) -> str:
    inner = getattr(err, "error", None)
    msg = getattr(inner, "message", None) if inner is not None else None
    return str(msg or getattr(err, "message", "") or err)[:500]


def status_code(err: Any) -> int:
    return int(getattr(err, "status_code", 0) or 0)


def retry_after(err: Any, default: float = 30.0) -> float:
    resp = getattr(err, "response", None)
    headers = getattr(resp, "headers", None) or {}
    for key in ("Retry-After", "retry-after", "x-ms-retry-after-ms"):
        value = headers.get(key)
        if value:
            try:
                seconds = float(value)
                return seconds / 1000.0 if key == "x-ms-retry-after-ms" else seconds
            except ValueError:
                continue
    return default


def throttle_of(err: Any) -> tuple[str, str]:
    """(code, limit) of a 429. Resource Manager answers SubscriptionRequestsThrottled; the Compute resource
    provider answers OperationNotAllowed with the reason in its details (TooManyRequests, its target the
    policy, e.g. PutVM3Min), and names the policy in x-ms-ratelimit-remaining-resource too."""
    code = error_code(err)
    inner = getattr(err, "error", None)
    for detail in getattr(inner, "details", None) or []:
        if getattr(detail, "code", None) == "TooManyRequests":
            return "TooManyRequests", str(getattr(detail, "target", "") or "")
    resp = getattr(err, "response", None)
    # One value per policy, joined by commas when several came: "Microsoft.Compute/HighCostGet3Min;159, ...;0"
    remaining = str((getattr(resp, "headers", None) or {}).get("x-ms-ratelimit-remaining-resource") or "")
    spent = [v.strip().split(";")[0] for v in remaining.split(",") if v.strip().endswith(";0")]
    limit = spent[0].split("/", 1)[-1] if spent else ""
    if not code or code == "OperationNotAllowed":
        code = "TooManyRequests"
    return code, limit


def translate(err: Exception, doing: str) -> ProviderError:
    """One Azure exception -> one ProviderError whose reason says what to do."""
    exceptions = sdk.core_exceptions
    ClientAuthenticationError, HttpResponseError = exceptions.ClientAuthenticationError, exceptions.HttpResponseError
    ServiceRequestError, ServiceResponseError = exceptions.ServiceRequestError, exceptions.ServiceResponseError

    if isinstance(err, ProviderError):
        return err
    code = error_code(err)
    msg = error_message(err)
    status = status_code(err)
    if isinstance(err, ClientAuthenticationError) or status in (401, 403) or code in AUTH_CODES:
        return AuthError(
            f"Azure rejected the service principal while {doing} ({code or status or 'authentication'}): {msg}. "
            "Check the tenant ID, client ID and secret value (not its ID, not expired), and that the Tensorant "
            "roles are assigned to this application at the documented scopes.", code=code or "AuthFailed")
    if code == "MissingSubscriptionRegistration":
        return PermanentError(
            f"The subscription is not registered for a resource provider ({msg}). Ask your subscription "
            "administrator to register Microsoft.Compute and Microsoft.Network under Subscriptions -> Resource "
            "providers.", code=code)
    if code in ("SubscriptionNotFound", "InvalidSubscriptionId"):
        return PermanentError(f"Subscription not found ({code}): copy the subscription ID from the subscription's "
                              "overview again; only public-cloud subscriptions are supported.", code=code)
    if status == 429:
        code, limit = throttle_of(err)
        wait = retry_after(err)
        return ThrottledError(f"Azure throttled {doing} ({code}{': ' + limit if limit else ''}); retrying after the "
                              f"{wait:g} s it asked for", code=code, retry_after_s=wait)
    if code in CAPACITY_CODES and code != "SkuNotAvailable":
        return CapacityError(
            f"Azure has no capacity for this GPU size in the region right now ({code}). Try again later, "
            "choose another GPU in the catalog, or use a region with capacity; quota does not reserve capacity.",
            code=code)
    if code == "SkuNotAvailable":
        return CapacityError(
            f"This VM size is not available to your subscription in the region ({code}: {msg}). Choose another "
            "GPU in the catalog, or ask Azure support to enable the size for your subscription.", code=code)
    if code == "OperationNotAllowed" and not _QUOTA_MESSAGE.search(msg):
        if _BUSY_MESSAGE.search(msg):  # a VM being deleted, a disk its VM still holds: passes by itself
            return RetryableError(f"Azure is still busy with a resource while {doing} ({code}): {msg}", code=code,
                                  retry_after_s=30.0)
        return PermanentError(f"Azure did not allow {doing} ({code}): {msg}", code=code)
    if code in QUOTA_CODES or code == "OperationNotAllowed":
        return QuotaError(
            f"Azure refused for quota or policy ({code}): {msg}. In Subscriptions -> Usage + quotas, request "
            "enough vCPUs for the VM family and Total Regional vCPUs in this region; approval does not reserve "
            "capacity.", code=code)
    if isinstance(err, (ServiceRequestError, ServiceResponseError)) or not (isinstance(err, HttpResponseError) or code):
        # No answer from Azure (refused, reset, timed out, a proxy's or TLS failure) or not an SDK error at
        # all: the text may name a proxy URL or an internal host, so it goes to the log only (issue 28.17).
        get_logger().warning("Azure unreachable while %s: %s: %s", doing, type(err).__name__, err)
        return RetryableError(f"Azure unreachable while {doing}: {type(err).__name__}", code="Unreachable")
    if isinstance(err, HttpResponseError) and (status >= 500 or status == 409 or status == 0):
        return RetryableError(f"Azure error while {doing} ({code or status}): {msg}", code=code or str(status))
    return PermanentError(f"Azure refused {doing} ({code or status}): {msg}", code=code or str(status))


class ProvisioningFailure(Exception):
    """A failed provisioning seen in a VM's instance view, shaped like an ARM error for translate()."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.error = type("E", (), {"code": code, "message": message})()
        self.status_code = 0

    def __str__(self) -> str:
        return str(self.error.message)
