"""Translate botocore errors into shared.errors, with reasons a user can act on.

Throttling is the only error retried (by client.AwsClient.call, with backoff and jitter);
everything else is classified once and raised.
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

THROTTLE_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException",
    "RequestThrottled", "RequestThrottledException", "SlowDown", "EC2ThrottledException",
})
AUTH_CODES = frozenset({
    "AuthFailure", "UnauthorizedOperation", "ExpiredToken", "ExpiredTokenException",
    "InvalidClientTokenId", "SignatureDoesNotMatch", "AccessDenied", "AccessDeniedException",
    "UnrecognizedClientException", "InvalidAccessKeyId", "RequestExpired", "OptInRequired",
    "Blocked", "PendingVerification",
})
# Codes of an account or region that is not ready, not of bad keys: each has its own remedy.
ACCOUNT_STATE_HINTS = {
    "PendingVerification": ("the AWS account is still being verified (new accounts: usually minutes, up to 4 "
                            "hours); wait for AWS's email that it is active, then launch again."),
    "OptInRequired": ("{region} is an opt-in region that this account has not enabled (or a subscription is "
                      "missing): an account administrator enables it under Account → AWS Regions, then the "
                      "connection is checked again."),
    "Blocked": ("the AWS account is blocked (unpaid bill, verification or a policy issue): contact AWS Support "
                "or check the account's billing; nothing in the connection can fix it."),
}
# EC2 answers these as server errors (HTTP 500); failover (shared/services/steps/launch.py) moves to the
# run's next candidate on any of them or of QUOTA_CODES.
CAPACITY_CODES = frozenset({"InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
                            "UnfulfillableCapacity"})
QUOTA_CODES = frozenset({"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxInstanceCountExceeded",
                         "MaxSpotInstanceCountExceeded"})
UNSUPPORTED_CODES = frozenset({"Unsupported", "InvalidParameterCombination", "InvalidInstanceType",
                               "UnsupportedOperation"})
TRANSIENT_CODES = frozenset({"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable",
                             "ServerInternal", "InternalServerException", "ServiceUnavailableException"})
NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidVolume.NotFound"})

# Each refusal kind of shared.providers.base.ERROR_KINDS -> EC2's codes for it (the contract checks each).
ERROR_TABLE: dict[str, frozenset[str]] = {
    "capacity": CAPACITY_CODES, "quota": QUOTA_CODES | {"VolumeLimitExceeded"}, "auth": AUTH_CODES,
    "not_found": NOT_FOUND_CODES, "throttled": THROTTLE_CODES,
}

_ZONE = re.compile(r"\b[a-z]{2}(?:-[a-z]+)+-\d[a-z]\b")


def code_of(exc: BaseException) -> str:
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def message_of(exc: BaseException) -> str:
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message", "")) or str(exc)


def is_throttle(exc: BaseException) -> bool:
    return code_of(exc) in THROTTLE_CODES


def zones_with_capacity(message: str, requested_zone: str = "") -> list[str]:
    """AWS names zones that do have capacity ("... or choosing us-east-1b, us-east-1c.")."""
    _, _, tail = message.partition("choosing")
    return [z for z in dict.fromkeys(_ZONE.findall(tail)) if z != requested_zone]


def quota_name(instance_type: str) -> str:
    family = instance_type.split(".", 1)[0]
    if family.startswith("p"):
        return "Running On-Demand P instances"
    return "Running On-Demand G and VT instances"


def translate(exc: BaseException, *, action: str, region: str = "", zone: str = "",
              instance_type: str = "") -> ProviderError:
    """One vendor error -> one error of the shared tree. `action` says what we were doing."""
    if isinstance(exc, ProviderError):
        return exc
    code = code_of(exc)
    message = message_of(exc)
    if code in THROTTLE_CODES:
        return ThrottledError(f"AWS throttled {action} ({code}); will retry", code=code, retry_after_s=30.0)
    if code in CAPACITY_CODES:
        where = f" in {zone}" if zone else ""
        others = zones_with_capacity(message, zone)
        hint = (f" AWS reports capacity in {', '.join(others)}: connect a subnet in one of those zones, "
                "or choose another GPU type or try later.") if others else \
            " Choose another GPU type, use a subnet in another availability zone, or try again later."
        return CapacityError(f"AWS has no {instance_type or 'instance'} capacity{where} right now.{hint}",
                             code=code)
    if code in QUOTA_CODES or (code == "InvalidParameterValue" and "quota" in message.lower()):
        quota = quota_name(instance_type) if instance_type else "the instance family's On-Demand quota"
        return QuotaError(
            f"Your EC2 vCPU quota does not allow {instance_type or 'this instance'} in {region}: in Service "
            f"Quotas → Amazon EC2, request an increase of '{quota}' to at least the instance's vCPUs plus "
            f"those of other running instances in that group. AWS said: {message}", code=code)
    if code in AUTH_CODES:
        if code in ("ExpiredToken", "ExpiredTokenException", "RequestExpired"):
            return AuthError("The AWS session token has expired; save the connection with fresh credentials "
                             "from an identity in the same account.", code=code)
        if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            return AuthError(f"AWS denied {action} ({code}): the connection's IAM policy does not allow it. "
                             "Compare it with the policy template in the AWS connection guide (approved AMI, "
                             "subnet, security group, key pair and the tensorant:managed tag condition).",
                             code=code)
        if code in ACCOUNT_STATE_HINTS:
            # The keys are fine: the account or region is not ready, so "check the access key" misleads.
            return AuthError(f"AWS refused {action} ({code}): {ACCOUNT_STATE_HINTS[code].format(region=region or 'the region')}",
                             code=code)
        return AuthError(f"AWS rejected the credentials during {action} ({code}); check the access key ID "
                         "and secret, or create a new access key for the dedicated IAM user.", code=code)
    if code == "InsufficientFreeAddressesInSubnet":
        return PermanentError(f"The connection's subnet has no free IP address left for {action} ({code}): free "
                              "addresses in it (terminate unused instances or network interfaces) or save the "
                              "connection with a subnet that has more (a larger CIDR block).", code=code)
    if code == "VolumeLimitExceeded":
        return QuotaError(f"Your EBS storage quota in {region or 'this region'} does not allow the run's disk "
                          f"({code}): in Service Quotas → Amazon Elastic Block Store, request an increase of the "
                          "volume type's storage quota (e.g. 'Storage for General Purpose SSD (gp3) volumes, in "
                          f"TiB'), or delete unused volumes. AWS said: {message}", code=code)
    if code in UNSUPPORTED_CODES:
        return PermanentError(f"AWS cannot run {instance_type or 'this request'} as configured ({code}): "
                              f"{message} Choose another GPU type or zone.", code=code)
    if code == "IdempotentParameterMismatch":
        return PermanentError("AWS already has a launch for this run with different parameters; "
                              "release the run and launch a new one.", code=code)
    if code in TRANSIENT_CODES:
        return RetryableError(f"AWS had a transient error during {action} ({code}); will retry", code=code)
    if code.startswith(("InvalidAMIID", "InvalidSubnet", "InvalidGroup", "InvalidKeyPair",
                        "InvalidParameterValue", "InvalidBlockDeviceMapping", "InvalidIamInstanceProfile")):
        return PermanentError(f"AWS rejected {action} ({code}): {message} "
                              "Check the connection's AMI, subnet, security group, key pair and profile.",
                              code=code)
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if not code:
        # No AWS error code: a connection problem, timeout or similar on our side of the wire. Its text
        # (a proxy URL, an endpoint, an internal host) goes to the log only; the reason names the class.
        get_logger().warning("could not reach AWS during %s: %s: %s", action, type(exc).__name__, exc)
        return RetryableError(f"could not reach AWS during {action} ({type(exc).__name__}); will retry")
    if status >= 500:
        return RetryableError(f"AWS error during {action} ({code}): {message}", code=code)
    return PermanentError(f"AWS rejected {action} ({code}): {message}", code=code)
