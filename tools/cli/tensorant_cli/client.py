"""A small HTTP client for the Tensorant API that turns problem+json answers into ApiError."""

from __future__ import annotations

import json
import re
from typing import Any

from tensorant_cli.render import cli_field, cli_words, printable


class ApiError(Exception):
    """An error answer (application/problem+json: title, status, detail, errors[{field, message}])."""

    def __init__(self, status: int, title: str, detail: str = "", errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(f"{title}: {detail}" if detail else title)
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = errors or []

    def render(self, run_id: str = "<RUN_ID>") -> str:
        """The error for a terminal, in the CLI's words (flags, not API fields: see cli_words), each
        field error once: the API's detail often restates them ("discard: ...", "fix these fields
        and send again: a: ...; b: ..."), so only what the detail adds to them is printed."""
        head = f"error: {self.title}" + (f" (HTTP {self.status})" if self.status else "")
        lines = [head]
        fields = [(str(e.get("field") or e.get("name") or "?"), str(e.get("message") or e.get("detail") or ""))
                  for e in self.errors]
        detail = self.detail
        for field, message in fields:
            detail = detail.replace(f"{field}: {message}", "")
        detail = re.sub(r"(\s*;\s*)+", "; ", detail).strip(" ;")
        if detail:
            lines.append(f"  {cli_words(detail, run_id)}")
        for field, message in fields:
            lines.append(f"  - {cli_field(field)}: {cli_words(message, run_id)}")
        # The detail may quote a run's reason or an upstream error: printed line by line, made printable.
        return "\n".join(printable(line) for line in lines)


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 30) -> None:
        # The base URL; one given with the API's /api (as a banner once printed it) is the same
        # control plane: every path below starts with /api already.
        base = url.rstrip("/")
        self.url = base[:-len("/api")] if base.lower().endswith("/api") else base
        self.token = token
        self.timeout = timeout

    def request(self, method: str, path: str, *, body: Any = None, data: bytes | None = None,
                content_type: str | None = None, params: dict[str, str] | None = None) -> Any:
        """Send one request; return the decoded JSON answer (None when empty); raise ApiError otherwise."""
        import requests

        headers = {"Accept": "application/json, application/problem+json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            data = json.dumps(body).encode()
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        try:
            resp = requests.request(method, self.url + path, data=data, headers=headers, params=params,
                                    timeout=self.timeout)
        except requests.ConnectionError as exc:
            raise ApiError(0, f"cannot reach {self.url}",
                           "is the control plane running? (`make run`, or set TENSORANT_URL)") from exc
        except requests.Timeout as exc:
            raise ApiError(0, f"{method} {path} timed out after {self.timeout:.0f} s") from exc
        if resp.status_code >= 400:
            raise _error(resp)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text

    def get(self, path: str, **params: str) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v} or None)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {})

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


def _error(resp: Any) -> ApiError:
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        title = str(doc.get("title") or doc.get("error") or resp.reason or "request failed")
        detail = str(doc.get("detail") or doc.get("message") or "")
        raw = doc.get("errors")
        errors = [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
        return ApiError(int(doc.get("status") or resp.status_code), title, detail, errors)
    text = (resp.text or "").strip()
    return ApiError(resp.status_code, resp.reason or "request failed", text[:500])
