"""Every error the control plane raises on purpose, in one module that imports nothing of ours, so
services, steps, storage and providers can raise them without importing the HTTP layer or a provider.

- AppError and its subclasses: a refusal of a request, with the HTTP status and title that
  shared.http.respond answers with (application/problem+json). Raised by what HTTP handlers call.
- ProviderError and its subclasses: the cloud error tree every provider (and storage backend)
  translates vendor errors into. Steps decide from it whether to retry or end the run.
- ConcurrencyError: an ETag-guarded write lost the race.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

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


def _model_at(model: type[BaseModel], path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model that holds the field at `path` inside `model` (through optional and list fields)."""
    for part in path:
        field = model.model_fields.get(str(part)) if isinstance(part, str) else None
        if field is None:
            if isinstance(part, int):  # an index into a list: the model stays the list's item
                continue
            return None
        inner = [a for a in (field.annotation, *typing.get_args(field.annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return None
        model = inner[0]
    return model


def _unknown_field(name: str, owner: type[BaseModel]) -> str:
    """extra_forbidden said what to fix: the nearest valid key and the list of them."""
    valid = sorted(owner.model_fields)
    near = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    # An abbreviation (lr for learning_rate, bs for batch_size) is far from its field by difflib's ratio.
    near = near or [v for v in valid if "".join(w[:1] for w in v.split("_")) == name.lower()
                    or (len(name) >= 3 and v.startswith(name.lower()))][:1]
    hint = f"did you mean {near[0]}? " if near else ""
    return f"not a field here; {hint}valid fields: {', '.join(valid)}"


def field_errors(exc: ValidationError, model: type[BaseModel] | None = None) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        owner = _model_at(model, tuple(err["loc"][:-1])) if model is not None and err["loc"] else None
        if err["type"] == "extra_forbidden" and owner is not None:
            msg = _unknown_field(str(err["loc"][-1]), owner)
        out.append({"field": loc or "body", "message": msg})
    return out


def invalid(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> InvalidInput:
    """A pydantic validation failure as a 422 naming each field to fix (under `prefix`, if given). With
    the `model` validated, an unknown key is answered with the nearest valid one and the list."""
    errors = field_errors(exc, model)
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
