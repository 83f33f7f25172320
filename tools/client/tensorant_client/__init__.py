"""tensorant_client: the typed Python client of the Tensorant control plane's HTTP API.

    from tensorant_client import Client
    api = Client("http://localhost:7071", token)
    run = api.get_run("r-...")                       # a models.RunView
    for run in api.iter_runs(state="training"): ...  # every page
    api.wait_for(run.id, {"succeeded"}, timeout=1800)

Errors are tensorant_client.errors.ApiError subclasses (NotFound, Conflict, InvalidInput with
`field_errors`, RateLimited, ...). Importing the package loads neither requests nor pydantic: Client
and models load on first use (the CLI uses tensorant_client.transport alone)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensorant_client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    FieldError,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Unauthorized,
    Unavailable,
    Unreachable,
)

if TYPE_CHECKING:
    from tensorant_client import models
    from tensorant_client.client import Client, WaitTimeout, WrongEnd

__all__ = ["ApiError", "BadRequest", "Client", "Conflict", "FieldError", "Forbidden", "InvalidInput", "NotFound",
           "PayloadTooLarge", "RateLimited", "ServerError", "Unauthorized", "Unavailable", "Unreachable",
           "WaitTimeout", "WrongEnd", "models"]


def __getattr__(name: str) -> Any:
    # import_module, not `from tensorant_client import ...`: that asks this function again.
    from importlib import import_module

    if name in ("Client", "WaitTimeout", "WrongEnd"):
        return getattr(import_module("tensorant_client.client"), name)
    if name == "models":
        return import_module("tensorant_client.models")
    raise AttributeError(name)
