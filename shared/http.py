"""HTTP plumbing shared by the blueprints: auth, body parsing, JSON and problem+json replies.

Handlers stay thin: `respond(lambda ctx: service_call(ctx, principal(ctx, req), parse(req, Model)))`: respond
builds the invocation context (shared/context.py) and hands it to the one service call.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from shared.context import Context, invocation
from shared.errors import (
    AppError,
    ConcurrencyError,
    Forbidden,
    InvalidInput,
    LengthRequired,
    PayloadTooLarge,
    invalid,
)
from shared.limits import MAX_JSON_BYTES, MAX_JSON_DEPTH, MAX_UPLOAD_BYTES
from shared.log import get_logger, redact
from shared.models import Role
from shared.security import Principal, authenticate

M = TypeVar("M", bound=BaseModel)
PROBLEM = "application/problem+json"


Body = type[BaseModel] | str  # a model, or a media type / named body (see shared.openapi)


def api(*, summary: str, request: Body | tuple[Body, ...] | None = None,
        response: Body | None = None, status: int = 200) -> Callable[[Any], Any]:
    """Describe a handler for /api/openapi.json (read back from the registered functions).

    A tuple `request` lists every body the handler accepts, e.g. (RunRecover, "application/zip").
    """

    def mark(fn: Any) -> Any:
        fn.__api__ = {"summary": summary, "request": request, "response": response, "status": status}
        return fn

    return mark


PLATFORM_ROUTES = "/api/platform/"


def request_path(req: Any) -> str:
    """The path the client asked for. The host builds req.url from the Host header and the path, so
    the Host header's text is cut off first: `Host: h/api/platform/` must not make a path of it."""
    url = str(req.url)
    rest = url.split("://", 1)[1] if "://" in url else url
    host = str(req.headers.get("Host") or "")
    cut = len(host) if host and rest.lower().startswith(host.lower()) else rest.find("/")
    rest = rest[cut:] if cut >= 0 else "/"
    return urlsplit("http://host" + (rest if rest.startswith("/") else "/" + rest)).path


def principal(ctx: Context, req: Any) -> Principal:
    """The caller. A platform admin acts on queues and the sweeper (/api/platform/...), never on an
    organization's data: its token is refused on every other route, whatever org it names."""
    found = authenticate(ctx, req.headers.get("Authorization"))
    if found.role == Role.admin and not request_path(req).startswith(PLATFORM_ROUTES):
        raise Forbidden("a platform admin token acts on queues and the sweeper (/api/platform/...), not on an "
                        "organization's runs, connections, projects or logs; use an owner or member token of that org")
    return found


def _too_deep() -> InvalidInput:
    return InvalidInput.field("body", f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels; send a flat object")


def json_depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_DEPTH:
                return depth
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def declared_length(req: Any, limit: int, *, required: bool, what: str = "the body", larger: str = "") -> int | None:
    """The request's Content-Length, checked before the body is read: 413 over `limit`,
    400 when it is not a number, 411 when `required` and missing (uploads)."""
    raw = req.headers.get("Content-Length")
    if raw is None or raw == "":
        if required:
            raise LengthRequired(f"send a Content-Length header with {what} (uploads are not chunked); "
                                 f"at most {limit // 2**20} MiB")
        return None
    if not raw.strip().isdigit() or len(raw.strip()) > 20:
        raise AppError("Content-Length must be the body's size in bytes")
    size = int(raw)
    if size > limit:
        raise PayloadTooLarge(f"{what} is {size} bytes, over the {limit // 2**20} MiB this endpoint takes"
                              + (f"; {larger}" if larger else ""))
    return size


def upload_body(req: Any, limit: int = MAX_UPLOAD_BYTES, what: str = "the upload", larger: str = "") -> bytes:
    """An upload's bytes, refused (411/413/400) before reading when its Content-Length says so."""
    size = declared_length(req, limit, required=True, what=what, larger=larger)
    body: bytes = req.get_body() or b""
    if len(body) > limit or len(body) != size:
        raise AppError(f"{what} has {len(body)} bytes, not the {size} its Content-Length says")
    return body


def json_body(req: Any) -> Any:
    declared_length(req, MAX_JSON_BYTES, required=False, what="the JSON body")
    raw = req.get_body() or b"{}"
    if len(raw) > MAX_JSON_BYTES:
        raise PayloadTooLarge(f"the JSON body is over {MAX_JSON_BYTES // 2**20} MiB")
    try:
        data = json.loads(raw)
    except RecursionError as exc:
        raise _too_deep() from exc
    except ValueError as exc:
        raise InvalidInput.field("body", f"the body is not valid JSON ({exc}); send a JSON object") from exc
    if json_depth(data) > MAX_JSON_DEPTH:
        raise _too_deep()
    if _SURROGATE_ESCAPE.search(raw):
        data = _without_lone_surrogates(data)
    return data


# JSON may escape a lone UTF-16 surrogate ("\ud800"): such a string cannot be encoded as UTF-8, so
# storing or answering it fails. Escaped pairs are joined by the parser; what is left alone is
# replaced with U+FFFD, as a UTF-8 decoder does with invalid bytes (a log line keeps the rest).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _without_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in value.items()}
    return value


def parse(req: Any, model: type[M]) -> M:
    data = json_body(req)
    if not isinstance(data, dict):
        raise InvalidInput.field("body", "send a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc, model=model) from exc


def to_json(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, list):
        return [to_json(o) for o in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    return obj


# Every API answer: never stored by a browser or proxy (they carry tokens' effects, presigned URLs, an
# org's data), and never sniffed into another type (a JSON body holding `<script>` stays JSON).
NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def reply(body: Any, status: int = 200, content_type: str = "application/json",
          headers: dict[str, str] | None = None) -> Any:
    import azure.functions as func

    text = body if isinstance(body, str) else json.dumps(to_json(body), default=str)
    return func.HttpResponse(text, status_code=status, mimetype=content_type.split(";")[0],
                             headers={**NO_STORE, "Content-Type": content_type, **(headers or {})})


def problem(status: int, title: str, detail: str, errors: list[dict[str, Any]] | None = None,
            headers: dict[str, str] | None = None) -> Any:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "errors": errors or []}
    return reply(body, status, PROBLEM, headers)


STORE_RETRY_AFTER_S = 5


def _store_unreachable(exc: BaseException) -> bool:
    """The Storage SDK could not reach the account (refused, timed out, reset) or the account said it
    is busy: not the request's fault and not the control plane's bug, so 503, not 500."""
    from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError

    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        return True
    return isinstance(exc, HttpResponseError) and exc.status_code in (500, 503)


def respond(call: Callable[[Context], Any], status: int = 200) -> Any:
    """Run one service call with this request's invocation context; translate errors into problem+json."""
    try:
        result = call(invocation())
    except AppError as exc:
        return problem(exc.status, exc.title, redact(exc.detail), redact(exc.errors), getattr(exc, "headers", None))
    except ValidationError as exc:
        err = invalid(exc)
        return problem(err.status, err.title, redact(err.detail), redact(err.errors))
    except ConcurrencyError:
        # Writers kept racing on one record past the retries: nothing of this request was written.
        return problem(409, "Conflict", "the record changed at the same time as this request, again and again; "
                       "this request's change was not saved: send it again", [], {"Retry-After": "1"})
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            # The only local disk the API writes is the development `local` storage: the upload's partial
            # file is removed where it was written (put_stream), so nothing half-written is kept.
            return problem(507, "Insufficient storage", "the storage is full, so nothing of this request was "
                           "kept: free space on the disk under TENSORANT_LOCAL_ROOT (or use S3 storage), then send "
                           "it again")
        if _store_unreachable(exc):
            get_logger().warning("state store unreachable", extra={"error": type(exc).__name__})
            return problem(503, "Service unavailable", "the control plane's state store (Azure Storage tables "
                           "and queues) cannot be reached; the request may not have completed: send it again in "
                           f"{STORE_RETRY_AFTER_S} s", [], {"Retry-After": str(STORE_RETRY_AFTER_S)})
        get_logger().exception("unhandled error")
        return problem(500, "Internal error", "the control plane failed; the error is logged with this request")
    if result is None:
        return reply({}, 204 if status == 200 else status)
    if hasattr(result, "get_body") and hasattr(result, "status_code"):
        return result
    return reply(result, status)
