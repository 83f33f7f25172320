"""The API's problem+json answers as exceptions: one class per status, each carrying the field errors.

Standard library only (the CLI imports this without pydantic)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FieldError:
    """One field the API refused, and what to fix (a problem's `errors[]`)."""

    field: str
    message: str


class ApiError(Exception):
    """An error answer (application/problem+json: title, status, detail, errors[{field, message}]), or
    status 0 when no answer came (the host unreachable, a timeout)."""

    status = 0

    def __init__(self, status: int, title: str, detail: str = "", errors: list[dict[str, Any]] | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{title}: {detail}" if detail else title)
        self.status = status
        self.title = title
        self.detail = detail
        # As the API sent them (the CLI renders these), and typed.
        self.errors: list[dict[str, Any]] = list(errors or [])
        self.field_errors = [FieldError(str(e.get("field") or e.get("name") or "?"),
                                        str(e.get("message") or e.get("detail") or "")) for e in self.errors]
        self.retry_after = retry_after

    def field(self, name: str) -> str | None:
        """The message for one field, if the API named it."""
        return next((e.message for e in self.field_errors if e.field == name), None)


class Unreachable(ApiError):
    """No answer: the control plane is not running at that URL, or did not answer in time."""


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    """Refused in the run's (or connection's) current state; nothing was changed."""

    status = 409


class LengthRequired(ApiError):
    status = 411


class PayloadTooLarge(ApiError):
    status = 413


class InvalidInput(ApiError):
    """422: `field_errors` names each field to fix."""

    status = 422


class RateLimited(ApiError):
    """429: send again after `retry_after` seconds (the client already retried, within its bound)."""

    status = 429


class ServerError(ApiError):
    status = 500


class Unavailable(ApiError):
    """503: the control plane's state store cannot be reached; send again after `retry_after` seconds."""

    status = 503


BY_STATUS: dict[int, type[ApiError]] = {cls.status: cls for cls in (
    BadRequest, Unauthorized, Forbidden, NotFound, Conflict, LengthRequired, PayloadTooLarge, InvalidInput,
    RateLimited, ServerError, Unavailable)}


def error_for(status: int, title: str, detail: str = "", errors: list[dict[str, Any]] | None = None,
              retry_after: float | None = None) -> ApiError:
    """The exception for an answer's status (ServerError for any other 5xx, ApiError for any other 4xx)."""
    cls = BY_STATUS.get(status) or (ServerError if status >= 500 else Unreachable if status == 0 else ApiError)
    return cls(status, title, detail, errors, retry_after)
