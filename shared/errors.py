"""Application errors that the HTTP layer turns into application/problem+json."""

from __future__ import annotations

from typing import Any


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


class ConcurrencyError(Exception):
    """An ETag-guarded write lost the race; re-read and try again."""
