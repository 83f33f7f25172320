"""Connection check messages never show an exception's own text (issue 28.17): a connection error's text
names the proxy it went through (with its credentials) or an internal host. The tenant sees a fixed
message and the exception's class; the text goes to the control plane's log only."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from shared.context import Context, invocation
from shared.errors import RetryableError
from shared.models import CheckStatus, ConnectionMessage, ConnectionRecord, ConnectionStatus

PROXY = "http://ops:hunter2@proxy.corp.internal:3128"
INTERNAL = "10.20.30.40"


def _leaks(text: str) -> bool:
    return any(s in text for s in ("hunter2", "proxy.corp.internal", INTERNAL))


def test_an_aws_connection_error_names_its_class_not_its_proxy(caplog: pytest.LogCaptureFixture) -> None:
    from botocore.exceptions import EndpointConnectionError, ProxyConnectionError

    from shared.providers.aws.errors import translate

    for exc in (ProxyConnectionError(proxy_url=PROXY, error="refused"),
                EndpointConnectionError(endpoint_url=f"https://{INTERNAL}/")):
        assert _leaks(str(exc))  # what the reason held before
        with caplog.at_level(logging.WARNING):
            err = translate(exc, action="checking the credentials")
        assert not _leaks(err.reason), err.reason
        assert type(exc).__name__ in err.reason
    assert _leaks(caplog.text)  # kept for the operator


def test_an_azure_connection_error_names_its_class_not_its_proxy() -> None:
    from azure.core.exceptions import ServiceResponseError

    from shared.providers.azure.errors import translate

    for exc in (ServiceResponseError(f"Connection aborted by {PROXY}"), ValueError(f"bad proxy {PROXY}")):
        err = translate(exc, "listing VMs")
        assert not _leaks(err.reason), err.reason
        assert type(exc).__name__ in err.reason and isinstance(err, RetryableError)


def test_a_check_that_crashes_reports_a_fixed_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.services.steps import validate_connection as step

    rec = ConnectionRecord(org="acme", slot="compute:aws", provider="aws", status=ConnectionStatus.checking,
                           config={}, sealed="", saved_at=datetime(2026, 1, 1, tzinfo=UTC))
    saved: list[ConnectionRecord] = []

    class Connections:
        def get(self, org: str, slot: str) -> tuple[ConnectionRecord, str]:
            return rec, "etag"

        def put(self, record: ConnectionRecord, etag: Any) -> None:
            saved.append(record)

    class Store:
        connections = Connections()

    def crash(ctx: Context, _: ConnectionRecord) -> Any:
        raise OSError(f"Tunnel connection failed: 407 at {PROXY} via {INTERNAL}")

    monkeypatch.setattr(step, "_run_checks", crash)
    ctx = invocation()
    step.validate_connection(Context(ctx.settings, cast(Any, Store()), ctx.queues),
                             ConnectionMessage(org="acme", slot="compute:aws"))
    [check] = saved[0].checks
    assert check.status == CheckStatus.fail and saved[0].status == ConnectionStatus.failed
    assert not _leaks(check.message) and "OSError" in check.message, check.message
