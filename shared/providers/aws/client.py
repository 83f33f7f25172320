"""The one door to boto3: sessions and clients (boto3 imported on first use), every API
call through `call` with throttling retried and errors translated (errors.translate).

Throttling is retried here, bounded, with exponential backoff and full jitter (and only while
the invocation's budget, shared/budget.py, has room for the sleep), then ThrottledError, which
the step turns into a delayed message to itself; capacity and every other error are never
retried. botocore's own retries are off so each request is counted once. Nothing here waits on
a long-running operation: the provider reports EC2's progress and the step asks again later.

Endpoints: botocore honours AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_<SERVICE> natively;
tests may also pass endpoint_url / pricing_endpoint_url.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from shared import budget
from shared.errors import ThrottledError
from shared.log import register_secret
from shared.providers.aws import sdk
from shared.providers.aws.config import AwsConfig
from shared.providers.aws.errors import is_throttle, translate

# on_api_call(service, operation, params) runs before every AWS API request (metrics,
# tests). Returning (http, parsed) answers the request itself (botocore's before-call
# short-circuit), which tests use to inject errors moto cannot produce
# (InsufficientInstanceCapacity, VcpuLimitExceeded, ...); None lets it go to AWS.
ApiCallHook = Callable[[str, str, dict[str, Any]], Any]

PRICING_REGION = "us-east-1"  # the Pricing API answers in few regions; clients for it go here
THROTTLE_ATTEMPTS = 4
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0


# One boto3 session for every connection of this process: a session loads and parses each service's model
# once (about 0.2 s of CPU for EC2), and a client made from it with the connection's own credentials costs
# about 10-20 ms. The session holds no credentials (each client gets its own explicitly); botocore's sessions
# are not safe to make clients from concurrently, so clients are made under _SESSION_LOCK.
_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


def _shared_session() -> Any:
    global _SESSION
    if _SESSION is None:
        _SESSION = sdk.boto3.session.Session()
    return _SESSION


class AwsClient:
    def __init__(self, config: AwsConfig, *, endpoint_url: str | None = None,
                 pricing_endpoint_url: str | None = None, sleep: Callable[[float], None] = time.sleep,
                 on_api_call: ApiCallHook | None = None) -> None:
        self.config = config
        self.region = config.region
        self.endpoint_url = endpoint_url
        self.pricing_endpoint_url = pricing_endpoint_url
        self.sleep = sleep
        self.on_api_call = on_api_call
        self._clients: dict[str, Any] = {}
        register_secret(config.secret_access_key.get_secret_value())
        if config.session_token:
            register_secret(config.session_token.get_secret_value())

    def client(self, service: str) -> Any:
        client = self._clients.get(service)
        if client is not None:
            return client
        with _SESSION_LOCK:  # a cached provider serves concurrent invocations (shared/runs/provider_cache.py)
            if service not in self._clients:
                self._clients[service] = self._new_client(service)
            return self._clients[service]

    def _new_client(self, service: str) -> Any:
        Config = sdk.botocore_config.Config

        cfg = Config(retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=60,
                     user_agent_extra="tensorant")
        kwargs: dict[str, Any] = {
            "config": cfg, "region_name": self.region, "aws_access_key_id": self.config.access_key_id,
            "aws_secret_access_key": self.config.secret_access_key.get_secret_value(),
            "aws_session_token": self.config.session_token.get_secret_value() if self.config.session_token else None,
        }
        if service == "pricing":
            kwargs["region_name"] = PRICING_REGION
            if self.pricing_endpoint_url:
                kwargs["endpoint_url"] = self.pricing_endpoint_url
        elif self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        client = _shared_session().client(service, **kwargs)
        client.meta.events.register("before-call", self._before_call)
        return client

    def _before_call(self, model: Any, params: Any, **_: Any) -> Any:
        if self.on_api_call is None:
            return None
        return self.on_api_call(model.service_model.signing_name, model.name, params)

    def call(self, service: str, operation: str, *, action: str = "", instance_type: str = "",
             zone: str = "", **params: Any) -> dict[str, Any]:
        """One API call, throttling retried with backoff and jitter; errors translated."""
        method = getattr(self.client(service), operation)
        for attempt in range(THROTTLE_ATTEMPTS):
            try:
                result: dict[str, Any] = method(**params)
                return result
            except Exception as exc:
                backoff = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** attempt))
                if is_throttle(exc) and attempt + 1 < THROTTLE_ATTEMPTS and budget.allows(backoff):
                    self.sleep(backoff)
                    continue
                raise translate(exc, action=action or operation, region=self.region, zone=zone,
                                instance_type=instance_type) from exc
        raise ThrottledError(f"AWS throttled {operation}")  # not reached

    def pages(self, service: str, operation: str, key: str, **params: Any) -> Iterator[Any]:
        """Every item under `key` across NextToken pages."""
        token = None
        while True:
            page = self.call(service, operation, **params, **({"NextToken": token} if token else {}))
            yield from page.get(key) or []
            token = page.get("NextToken")
            if not token:
                return
