"""The Storage clients' transport: environment read once, proxies still honoured."""

from __future__ import annotations

import pytest

from shared.storage_transport import POOL_SIZE, storage_transport


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "no_proxy",
                 "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


def test_without_proxies_one_session_that_does_not_reread_the_environment() -> None:
    transport = storage_transport()
    assert transport is not None
    session = transport.session
    assert session.trust_env is False and session.verify is True
    assert session.get_adapter("http://127.0.0.1:10002/")._pool_maxsize == POOL_SIZE


def test_a_ca_bundle_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    transport = storage_transport()
    assert transport is not None and transport.session.verify == "/etc/ssl/certs/ca-certificates.crt"


def test_with_a_proxy_the_sdk_default_reads_it_with_no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert storage_transport() is None


def test_the_store_and_queues_work_through_it(env: dict[str, str]) -> None:
    from azure.core.pipeline.transport import RequestsTransport

    from shared.queues import Queue, get_queues
    from shared.store import get_store

    transport = get_store()._service._client._client._pipeline._transport
    assert isinstance(transport, RequestsTransport) and transport.session.trust_env is False
    get_queues().send(Queue.launch, {"probe": 1})
    assert get_queues().length(Queue.launch.value) == 1
