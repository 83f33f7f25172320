"""The boot diagnostics read fetches a URI an ARM answer names: only an https Azure Storage blob host is
read, and no redirect is followed (AzureClient.read_tail, BLOB_HOST)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from shared.providers.azure.client import BLOB_HOST
from shared.providers.base import console_of
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.rig import REF, VM_ID
from tests.providers.azure.test_scope_and_reason import booted_spec


def _answer_uri(fake: FakeArm, uri: str) -> None:
    original = fake._vm_action

    def action(vm_id: str, act: str, method: str) -> Any:
        status, headers, body = original(vm_id, act, method)
        if act == "retrievebootdiagnosticsdata":
            body = {**body, "serialConsoleLogBlobUri": uri}
        return status, headers, body

    fake._vm_action = action  # type: ignore[method-assign,assignment]


@pytest.mark.parametrize("uri", [
    "http://{fake}/bootdiag/x/serialconsole.log?sig=s",  # not https
    "https://169.254.169.254/metadata/instance?api-version=2021-02-01",
    "https://localhost:{port}/bootdiag/x/serialconsole.log",
    "https://acct.blob.core.windows.net.evil.example/x?sig=s",
    "https://acct.blob.core.windows.net@{fake}/x?sig=s",  # userinfo: the request would go to the fake
    "https://evil.example/acct.blob.core.windows.net/x",
    "https://[::1]:{port}/x",
])
def test_a_uri_that_is_not_a_storage_blob_is_not_read(fake: FakeArm, compute: Any, uri: str) -> None:
    compute.launch(booted_spec())
    fake.set_console(VM_ID, "boot line")
    port = fake.url.rsplit(":", 1)[1]
    _answer_uri(fake, uri.format(fake=fake.url.removeprefix("https://"), port=port))
    text = console_of(compute, REF, [])
    assert text.startswith("console output unavailable: ") and "not an https Azure Storage blob URI" in text, text
    assert fake.blob_reads == []  # nothing was requested
    assert "169.254" not in text and "evil" not in text


def test_a_redirect_from_the_blob_is_not_followed(fake: FakeArm, compute: Any) -> None:
    compute.launch(booted_spec())
    fake.set_console(VM_ID, "the real serial log\n")
    original = fake._serial_log
    followed: list[str] = []

    def redirecting(method: str, query: dict[str, list[str]], headers: Any) -> Any:
        if "elsewhere" in query:
            followed.append(method)
            return 200, {"Content-Type": "text/plain"}, b"INTERNAL SECRET FROM ELSEWHERE\n"
        if method == "GET":
            return 302, {"Location": f"{fake.url}/bootdiag/x/serialconsole.log?elsewhere=1"}, b""
        return original(method, query, headers)

    fake._serial_log = redirecting  # type: ignore[method-assign,assignment]
    text = console_of(compute, REF, [])
    assert followed == [] and "SECRET" not in text, text
    assert text == "console output unavailable: the serial console log answered HTTP 302", text


def test_the_storage_host_pattern() -> None:
    good = ["acct01.blob.core.windows.net", "md-h4mp5ckgq0tz.z21.blob.storage.azure.net",
            "md-h4mp5ckgq0tz.blob.storage.azure.net"]
    bad = ["acct.blob.core.windows.net:8443", "blob.core.windows.net", "a.b.blob.core.windows.net",
           "acct.blob.core.windows.net.", "ACCT.blob.core.windows.net.evil", "acct.file.core.windows.net",
           "127.0.0.1", "acct.blob.core.windows.net\n"]
    assert all(re.fullmatch(BLOB_HOST, h) for h in good)
    assert not any(re.fullmatch(BLOB_HOST, h) for h in bad)
