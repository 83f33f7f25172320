"""Client: every operation of the API (tensorant_client.operations) sent through one Transport, the
answers as models, lists as iterators over every page, and wait_for."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

from tensorant_client import models
from tensorant_client.operations import OPERATIONS, Api
from tensorant_client.transport import DEFAULT_MAX_WAIT_S, DEFAULT_RETRIES, Transport

ENDED = frozenset({"succeeded", "failed", "cancelled"})  # a run in one of these never moves again


class WaitTimeout(TimeoutError):
    """wait_for's timeout passed first; `run` is the run as last read."""

    def __init__(self, message: str, run: models.RunView) -> None:
        super().__init__(message)
        self.run = run


class WrongEnd(RuntimeError):
    """The run ended in a state wait_for was not waiting for (it can never reach them now); `run` says why."""

    def __init__(self, message: str, run: models.RunView) -> None:
        super().__init__(message)
        self.run = run


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return value


class Client(Api):
    """The control plane at `url` as `token`. 429 and 503 answers are sent again after their Retry-After
    (at most `retries` times, none longer than `max_wait_s`); every other error raises its ApiError."""

    def __init__(self, url: str = "http://localhost:7071", token: str | None = None, *, timeout: float = 30,
                 retries: int = DEFAULT_RETRIES, max_wait_s: float = DEFAULT_MAX_WAIT_S,
                 sleep: Callable[[float], None] = time.sleep, transport: Transport | None = None) -> None:
        self.transport = transport or Transport(url, token, timeout=timeout, retries=retries, max_wait_s=max_wait_s,
                                                sleep=sleep)
        self.sleep = sleep

    def _call(self, op: str, path: dict[str, str], query: dict[str, Any] | None = None, body: Any = None,
              data: bytes | None = None) -> Any:
        spec = OPERATIONS[op]
        url = spec.path.format(**{k: quote(str(v), safe="") for k, v in path.items()})
        if spec.body == "json" and body is None and data is None:
            body = {}
        content_type = None
        if data is not None:
            content_type = spec.body if spec.body and spec.body != "json" else "application/zip"
        answer = self.transport.request(spec.method, url, body=_json(body) if data is None else None, data=data,
                                        content_type=content_type, params=query)
        if spec.returns and isinstance(answer, dict):
            return models.MODELS[spec.returns].model_validate(answer)
        return answer

    def _pages(self, op: str, path: dict[str, str], query: dict[str, Any]) -> Iterator[Any]:
        item = models.MODELS.get(OPERATIONS[op].items or "")
        cursor: str | None = None
        while True:
            page = self._call(op, path, {**query, "cursor": cursor})
            for row in page.get("items") or []:
                yield item.model_validate(row) if item is not None else row
            cursor = page.get("next")
            if not cursor:
                return

    def wait_for(self, run_id: str, states: Collection[str] = ENDED, timeout: float = 3600,
                 interval: float = 5) -> models.RunView:
        """Read the run every `interval` seconds until its state is one of `states`; return it then. Raises
        WrongEnd when it ended in another state (it cannot reach them any more), WaitTimeout after `timeout`."""
        wanted = {str(getattr(s, "value", s)) for s in states}
        deadline = time.monotonic() + timeout
        while True:
            run = self.get_run(run_id)
            if run.state in wanted:
                return run
            if run.state in ENDED:
                raise WrongEnd(f"run {run_id} ended {run.state}, not {' or '.join(sorted(wanted))}: {run.reason}", run)
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"run {run_id} is still {run.state} after {timeout:g} s", run)
            self.sleep(min(interval, left))

    def wait_for_connection(self, provider: str, timeout: float = 120, interval: float = 1) -> models.ConnectionView:
        """Read a compute connection until its checks are done (status no longer `checking`); return it."""
        deadline = time.monotonic() + timeout
        while True:
            conn = self.get_compute(provider)
            if conn.status != "checking":
                return conn
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the {provider} connection is still checking after {timeout:g} s")
            self.sleep(min(interval, left))
