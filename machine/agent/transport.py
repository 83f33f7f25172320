"""HTTP for the agent: retries with backoff, errors described without URLs, the control plane client.

urllib only (the training image has no requests). Presigned URLs are secrets, so no
message here ever holds a URL.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from machine.agent.config import AgentConfig
from machine.agent.redact import redact_text, register_secret


def _is_transient(exc: BaseException) -> bool:
    """A failure worth retrying: connection refused, timeout, 5xx, 429."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500 or exc.code == 429
    return isinstance(exc, (urllib.error.URLError, ConnectionError, TimeoutError, OSError))


def with_retries(action: Callable[[], Any], *, give_up_after_s: float, log: Callable[[str], None], what: str,
                 sleep: Callable[[float], None] = time.sleep, max_backoff_s: float = 30.0) -> Any:
    """Run action, retrying transient errors with capped exponential backoff until the deadline.
    A non-transient error (a 4xx) is raised at once."""
    deadline = time.monotonic() + give_up_after_s
    delay = 0.5
    while True:
        try:
            return action()
        except Exception as exc:
            if not _is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            log(f"{what} failed ({describe_error(exc)}); retrying in {delay:.1f}s")
            sleep(delay)
            delay = min(delay * 2, max_backoff_s)


def describe_error(exc: BaseException) -> str:
    """An error without the URL (presigned URLs are secrets), as a sentence a person reads in a run's log:
    not a raw "[Errno 2] No such file or directory: '/long/path'" or a JSONDecodeError's position."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        return f"connection error: {describe_error(reason) if isinstance(reason, BaseException) else reason}"
    if isinstance(exc, OSError) and exc.errno is not None and exc.strerror:
        name = os.path.basename(str(exc.filename)) if exc.filename else ""
        return redact_text(exc.strerror.lower() + (f" ({name})" if name else ""))
    if isinstance(exc, json.JSONDecodeError):
        return "the answer was not JSON"
    if "DecodeError" in type(exc).__name__:
        return f"the data could not be decoded ({type(exc).__name__})"
    return redact_text(f"{type(exc).__name__}: {exc}")


@dataclass
class Answer:
    ok: bool
    body: dict[str, Any]
    rejected: bool = False  # a 4xx: sending the same again will not help


RESTART = "restart"


class ControlPlane:
    """POSTs to /api/agent/runs/{id}/{heartbeat,complete,...} with the run's bearer token.

    The token is short-lived: a heartbeat reply may carry a fresh one, which replaces it
    (and is kept in the state file, so a restarted agent still holds a valid one). A retained
    machine is stopped for hours or days, longer than a token lives: a call refused 401 offers
    the token, once, to the restart exchange (POST .../restart), which gives a fresh one when the
    control plane started this machine again after the token was issued; the call is then sent
    again. `on_restart` gets the exchange's answer (the agent keeps the token and the storage
    access it carries)."""

    def __init__(self, config: AgentConfig, log: Callable[[str], None], token: str = "") -> None:
        self.config = config
        self.log = log
        self.rejected = 0  # the HTTP status of the last post the control plane refused (a 4xx), else 0
        self.token = token or config.token
        self.offered = ""  # the last token offered to the restart exchange: each is offered once
        self.on_restart: Callable[[dict[str, Any]], None] | None = None
        self.exchange_lock = threading.Lock()  # heartbeats and the completion may be refused together

    def switch_token(self, token: str) -> None:
        register_secret(token)
        self.token = token

    def post(self, what: str, body: dict[str, Any], *, give_up_after_s: float) -> Answer:
        sent_with = self.token
        answer = self._post(what, body, give_up_after_s=give_up_after_s)
        if self.rejected == 401 and what != RESTART and self._exchange(sent_with, give_up_after_s):
            answer = self._post(what, body, give_up_after_s=give_up_after_s)
        return answer

    def _exchange(self, refused: str, give_up_after_s: float) -> bool:
        """After a 401: whether the restart exchange gave a fresh token (or another call already did)."""
        with self.exchange_lock:
            if self.token != refused:
                return True  # exchanged meanwhile by another call
            if self.offered == refused:
                return False
            self.offered = refused
            answer = self._post(RESTART, {}, give_up_after_s=give_up_after_s)
            token = answer.body.get("token")
            if not answer.ok or not isinstance(token, str) or not token:
                if not answer.rejected:
                    self.offered = ""  # no answer (the control plane unreachable): offered again at the next 401
                return False
            self.switch_token(token)
            self.log("this machine was started again after its token expired; the token was exchanged for a "
                     "fresh one")
            if self.on_restart is not None:
                self.on_restart(answer.body)
            return True

    def _post(self, what: str, body: dict[str, Any], *, give_up_after_s: float) -> Answer:
        url = f"{self.config.api_url}/api/agent/runs/{self.config.run_id}/{what}"
        data = json.dumps(body).encode()

        def send() -> dict[str, Any]:
            request = urllib.request.Request(url, data=data, method="POST", headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.token}",
            })
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
            try:
                reply = json.loads(raw) if raw else {}
            except ValueError:
                reply = {}
            return reply if isinstance(reply, dict) else {}

        self.rejected = 0
        try:
            return Answer(True, with_retries(send, give_up_after_s=give_up_after_s, log=self.log, what=what))
        except urllib.error.HTTPError as exc:
            self.rejected = exc.code if 400 <= exc.code < 500 else 0
            detail = exc.read(500).decode("utf-8", "replace") if exc.fp else ""
            self.log(f"{what} rejected: HTTP {exc.code}: {redact_text(detail)}")
            return Answer(False, {}, rejected=400 <= exc.code < 500 and exc.code != 429)
        except Exception as exc:
            self.log(f"{what} gave up: {describe_error(exc)}")
            return Answer(False, {})
