"""Sending one request: the base URL, the token, problem+json answers as typed exceptions, and the
retries a 429 or 503 asks for (after its Retry-After, within a bound).

Standard library only at import; `requests` is imported when the first request is sent. The CLI
uses this module alone (tensorant_cli.client), so the CLI never loads pydantic."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from tensorant_client.errors import ApiError, Unreachable, error_for

RETRIED = (429, 503)  # the API's "send it again after Retry-After seconds" (shared/openapi.py)
DEFAULT_RETRIES = 3
DEFAULT_MAX_WAIT_S = 60.0  # a single wait longer than this is not waited: the error is raised at once
FALLBACK_WAIT_S = 2.0  # a 429/503 without a readable Retry-After: 2, 4, 8 s


def base_url(url: str) -> str:
    """The control plane's URL without a trailing /api (as a banner once printed it): every path starts
    with /api already."""
    base = url.rstrip("/")
    return base[:-len("/api")] if base.lower().endswith("/api") else base


def retry_after_s(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Retry-After as seconds: a number of seconds, or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


class Transport:
    """One control plane at `url`, as `token` (None: no Authorization header)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30, retries: int = DEFAULT_RETRIES,
                 max_wait_s: float = DEFAULT_MAX_WAIT_S, sleep: Callable[[float], None] = time.sleep,
                 session: Any = None) -> None:
        self.url = base_url(url)
        self.token = token
        self.timeout = timeout
        self.retries = max(0, retries)
        self.max_wait_s = max_wait_s
        self.sleep = sleep
        self.session = session  # a requests.Session (connection reuse); None: one made at the first request
        self.waited: list[float] = []  # each retry's wait, in order (what a caller or a test can read)

    def headers(self, accept: str = "application/json, application/problem+json") -> dict[str, str]:
        headers = {"Accept": accept}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _session(self) -> Any:
        if self.session is None:
            import requests

            self.session = requests.Session()
        return self.session

    def send(self, method: str, path: str, *, body: Any = None, data: bytes | None = None,
             content_type: str | None = None, params: Mapping[str, Any] | None = None,
             accept: str | None = None, stream: bool = False) -> Any:
        """Send one request (again after each 429/503, at most `retries` times, each after its Retry-After
        when that is at most max_wait_s); return the requests.Response of a 2xx, raise the typed ApiError
        of anything else."""
        import requests

        headers = self.headers(accept) if accept else self.headers()
        if body is not None:
            data = json.dumps(body).encode()
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        query = {k: str(v) for k, v in (params or {}).items() if v is not None and v != ""} or None
        attempt = 0
        while True:
            try:
                resp = self._session().request(method, self.url + path, data=data, headers=headers, params=query,
                                               timeout=self.timeout, stream=stream)
            except requests.ConnectionError as exc:
                raise Unreachable(0, f"cannot reach {self.url}",
                                  "is the control plane running? (`make run`, or set TENSORANT_URL)") from exc
            except requests.Timeout as exc:
                raise Unreachable(0, f"{method} {path} timed out after {self.timeout:.0f} s") from exc
            if resp.status_code < 400:
                return resp
            error = problem(resp)
            if resp.status_code not in RETRIED or attempt >= self.retries:
                raise error
            wait = error.retry_after if error.retry_after is not None else FALLBACK_WAIT_S * 2 ** attempt
            if wait > self.max_wait_s:
                raise error  # longer than this client waits: the caller decides (error.retry_after says when)
            attempt += 1
            self.waited.append(wait)
            resp.close()
            self.sleep(wait)

    def fetch(self, url: str, *, timeout: float | None = None) -> Any:
        """GET an absolute URL outside the API (a presigned download link) as a stream: no Authorization
        header goes to it, and no retry. Its requests.Response, or Unreachable / the status's ApiError."""
        import requests

        try:
            resp = self._session().get(url, timeout=timeout or self.timeout, stream=True)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise Unreachable(0, "the download link could not be reached", type(exc).__name__) from exc
        if resp.status_code >= 400:
            resp.close()
            raise error_for(resp.status_code, "the download link was refused",
                            "it is short-lived: ask for the download again")
        return resp

    def request(self, method: str, path: str, *, body: Any = None, data: bytes | None = None,
                content_type: str | None = None, params: Mapping[str, Any] | None = None) -> Any:
        """send(), the answer decoded: JSON, text when it is not JSON, None when empty."""
        resp = self.send(method, path, body=body, data=data, content_type=content_type, params=params)
        if not resp.content:
            return None
        ctype = resp.headers.get("Content-Type", "")
        if ctype.startswith("application/zip") or ctype.startswith("application/octet-stream"):
            return resp.content
        try:
            return resp.json()
        except ValueError:
            return resp.text


def problem(resp: Any) -> ApiError:
    """The typed exception of an error answer (problem+json, or whatever else the body holds)."""
    wait = retry_after_s(resp.headers.get("Retry-After"))
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        title = str(doc.get("title") or doc.get("error") or resp.reason or "request failed")
        detail = str(doc.get("detail") or doc.get("message") or "")
        raw = doc.get("errors")
        errors = [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
        status = doc.get("status")
        return error_for(status if isinstance(status, int) and 400 <= status < 600 else resp.status_code,
                         title, detail, errors, wait)
    text = (resp.text or "").strip()
    return error_for(resp.status_code, resp.reason or "request failed", text[:500], retry_after=wait)


__all__ = ["ApiError", "Transport", "base_url", "problem", "retry_after_s"]
