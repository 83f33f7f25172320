"""The CLI's way to the API: a thin shim over tensorant_client (tools/client), the CLI's only HTTP code.

Commands call `client.get/post/put/delete/request` with a path and get the decoded JSON (dicts: the CLI
renders them as they come); an error answer raises ApiError, which renders itself in the CLI's words.
`client.api` is the typed tensorant_client.Client on the same connection (it loads pydantic, which the
CLI's own paths never do: the shim uses tensorant_client's transport alone)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from tensorant_cli.render import cli_field, cli_words, printable
from tensorant_client.errors import ApiError as ClientError
from tensorant_client.transport import Transport

if TYPE_CHECKING:
    import tensorant_client


def render_error(exc: ClientError, run_id: str = "<RUN_ID>") -> str:
    """The error for a terminal, in the CLI's words (flags, not API fields: see cli_words), each
    field error once: the API's detail often restates them ("discard: ...", "fix these fields
    and send again: a: ...; b: ..."), so only what the detail adds to them is printed."""
    head = f"error: {exc.title}" + (f" (HTTP {exc.status})" if exc.status else "")
    lines = [head]
    fields = [(e.field, e.message) for e in exc.field_errors]
    detail = exc.detail
    for field, message in fields:
        detail = detail.replace(f"{field}: {message}", "")
    detail = re.sub(r"(\s*;\s*)+", "; ", detail).strip(" ;")
    if detail:
        lines.append(f"  {cli_words(detail, run_id)}")
    for field, message in fields:
        lines.append(f"  - {cli_field(field)}: {cli_words(message, run_id)}")
    # The detail may quote a run's reason or an upstream error: printed line by line, made printable.
    return "\n".join(printable(line) for line in lines)


class ApiError(ClientError):
    """An error answer (application/problem+json: title, status, detail, errors[{field, message}]), as the
    CLI raises and renders it. tensorant_client's typed errors (NotFound, InvalidInput, ...) are its base's
    subclasses: main() renders those too."""

    @classmethod
    def of(cls, exc: ClientError) -> ApiError:
        return exc if isinstance(exc, ApiError) else cls(exc.status, exc.title, exc.detail, exc.errors,
                                                           exc.retry_after)

    def render(self, run_id: str = "<RUN_ID>") -> str:
        return render_error(self, run_id)


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 30) -> None:
        self.transport = Transport(url, token, timeout=timeout)
        self.url = self.transport.url  # without a trailing /api: every path below starts with /api already
        self.token = token
        self.timeout = timeout
        self._api: tensorant_client.Client | None = None

    @property
    def api(self) -> tensorant_client.Client:
        """The typed client (a method per operation, models, iterators, wait_for) on this connection."""
        if self._api is None:
            from tensorant_client import Client as Typed

            self._api = Typed(transport=self.transport)
        return self._api

    def request(self, method: str, path: str, *, body: Any = None, data: bytes | None = None,
                content_type: str | None = None, params: dict[str, str] | None = None) -> Any:
        """Send one request; return the decoded JSON answer (None when empty); raise ApiError otherwise."""
        try:
            return self.transport.request(method, path, body=body, data=data, content_type=content_type,
                                          params=params)
        except ClientError as exc:
            raise ApiError.of(exc) from exc

    def stream(self, path: str, *, params: dict[str, str] | None = None, accept: str) -> Any:
        """GET path as a stream (requests.Response): a download too large to hold."""
        try:
            return self.transport.send("GET", path, params=params, accept=accept, stream=True)
        except ClientError as exc:
            raise ApiError.of(exc) from exc

    def fetch(self, url: str, timeout: float) -> Any:
        """GET an absolute URL (a presigned download link: no Authorization) as a stream; raise ApiError."""
        try:
            return self.transport.fetch(url, timeout=timeout)
        except ClientError as exc:
            raise ApiError.of(exc) from exc

    def get(self, path: str, **params: str) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v} or None)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {})

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)
