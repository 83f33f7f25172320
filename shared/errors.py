"""Every error the control plane raises on purpose, in one module that imports nothing of ours, so
services, steps, storage and providers can raise them without importing the HTTP layer or a provider.

- AppError and its subclasses: a refusal of a request, with the HTTP status and title that
  shared.http.respond answers with (application/problem+json). Raised by what HTTP handlers call.
- ProviderError and its subclasses: the cloud error tree every provider (and storage backend)
  translates vendor errors into. Steps decide from it whether to retry or end the run.
- ConcurrencyError: an ETag-guarded write lost the race.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

# ---------------------------------------------------------------- refusals of a request (problem+json)


class AppError(Exception):
    status = 400
    title = "Bad request"

    def __init__(self, detail: str, *, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors or []


class InvalidInput(AppError):
    status = 422
    title = "Invalid input"

    @classmethod
    def field(cls, field: str, message: str) -> InvalidInput:
        return cls(f"{field}: {message}", errors=[{"field": field, "message": message}])


class Unauthorized(AppError):
    status = 401
    title = "Unauthorized"


class Forbidden(AppError):
    status = 403
    title = "Forbidden"


class NotFound(AppError):
    status = 404
    title = "Not found"


class Conflict(AppError):
    status = 409
    title = "Conflict"


class LengthRequired(AppError):
    status = 411
    title = "Length required"


class PayloadTooLarge(AppError):
    status = 413
    title = "Payload too large"


class TooManyRequests(AppError):
    """429 with Retry-After: a rate limit (shared/services/api/quotas.py)."""

    status = 429
    title = "Too many requests"

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        super().__init__(detail)
        self.headers = {"Retry-After": str(max(1, int(retry_after_s)))}


def field_errors(exc: ValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        out.append({"field": loc or "body", "message": msg})
    return out


def invalid(exc: ValidationError, prefix: str = "") -> InvalidInput:
    """A pydantic validation failure as a 422 naming each field to fix (under `prefix`, if given)."""
    errors = field_errors(exc)
    if prefix:
        errors = [{**e, "field": f"{prefix}.{e['field']}" if e["field"] != "body" else prefix} for e in errors]
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return InvalidInput(f"fix these fields and send again: {detail}", errors=errors)


# ---------------------------------------------------------------- the cloud error tree
#
# Permanent: retrying cannot help (bad credentials, zero quota, unsupported image, no capacity for
# this run). The step ends the run with `reason`, which says what the user can do.
# Retryable: throttling or a transient failure; the step retries after `retry_after_s`.


class ProviderError(Exception):
    def __init__(self, reason: str, *, code: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class PermanentError(ProviderError):
    pass


class AuthError(PermanentError):
    """Credentials rejected or expired (401/403). Never retried in a storm."""


class CapacityError(PermanentError):
    """No capacity for this machine type now; not permanent for the account."""


class QuotaError(PermanentError):
    pass


class RetryableError(ProviderError):
    def __init__(self, reason: str, *, code: str = "", retry_after_s: float = 30.0) -> None:
        super().__init__(reason, code=code)
        self.retry_after_s = retry_after_s


class ThrottledError(RetryableError):
    pass


# ---------------------------------------------------------------- the state store


class ConcurrencyError(Exception):
    """An ETag-guarded write lost the race; re-read and try again."""
