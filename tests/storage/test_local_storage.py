"""Local storage always lives under the control plane's own root, one directory per org;
an owner cannot name a host path, and the check's messages never carry errno text or paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.org_storage.config import LocalStorageConfig
from shared.org_storage.registry import make_storage, parse_storage_config
from shared.settings import Settings
from tests.harness import Harness


@pytest.mark.parametrize("directory", ["/etc", "/tmp/elsewhere", "../../other-org", "storage/org-b", "."])
def test_owner_cannot_name_a_host_path(harness: Harness, directory: str) -> None:
    status, body, _ = harness.call("PUT", "/api/connections/storage", json_body={"kind": "local", "directory": directory})
    assert status == 422, body
    assert "TENSORANT_LOCAL_ROOT" in body["detail"]
    with pytest.raises(ValidationError):
        parse_storage_config({"kind": "local", "directory": directory})


def test_each_org_gets_its_own_directory_under_the_root(tmp_path: Path) -> None:
    settings = Settings(local_root=str(tmp_path / "root"))
    a = make_storage(LocalStorageConfig(), settings, "org-a")
    b = make_storage(LocalStorageConfig(), settings, "org-b")
    a.put("datasets/p/d.jsonl", b"a")
    assert (tmp_path / "root" / "storage" / "org-a" / "datasets" / "p" / "d.jsonl").read_bytes() == b"a"
    with pytest.raises(Exception):  # noqa: B017 - missing in b, whatever the error type
        b.get("datasets/p/d.jsonl", 10)
    for key in ("../org-b/x", "/etc/passwd", "a/../../org-b/x"):
        with pytest.raises(ValueError):
            a.put(key, b"x")


@pytest.mark.parametrize("org", ["", "..", "org/../../x", "Org-A", "a\\b", "org-a\n"])
def test_org_name_cannot_leave_the_root(tmp_path: Path, org: str) -> None:
    with pytest.raises(ValueError):
        make_storage(LocalStorageConfig(), Settings(local_root=str(tmp_path)), org)


def test_check_messages_carry_no_errno_text_or_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # the root is a file: every write fails with an OSError
    checks = make_storage(LocalStorageConfig(), Settings(local_root=str(blocker)), "org-a").validate()
    text = " ".join(c.message for c in checks)
    assert checks[0].status.value == "fail"
    for leak in ("Not a directory", "Errno", str(tmp_path), "not-a-dir", "Permission denied"):
        assert leak not in text
    assert "operator" in text


def test_delete_prefix_removes_one_folder_inside_the_org(tmp_path: Path) -> None:
    s = make_storage(LocalStorageConfig(), Settings(local_root=str(tmp_path / "root")), "org-a")
    for key in ("data/r1/agent-state.json", "data/r1/adapter/a.safetensors", "data/r10/x", "runs/r1/adapter.zip"):
        s.put(key, b"x")
    assert s.delete_prefix("data/r1/") == 2
    assert s.get("data/r10/x", 10) == b"x" and s.get("runs/r1/adapter.zip", 10) == b"x"
    assert s.delete_prefix("data/r1/") == 0
    for bad in ("data/r1", "../org-b/", "/etc/"):
        with pytest.raises(ValueError):
            s.delete_prefix(bad)
