"""A committed dataset never changes, and local compute checks name no host path.

- A committed dataset never changes (a run must train on the data that was checked):
   - a second commit of a committed dataset (after another PUT through its upload URL, valid or
     invalid content) is refused before it writes anything, with a 409 that names no table, and the
     committed object is left as it was validated;
   - a commit that loses the race to a concurrent one writes only its own key (and removes it);
   - the launch step hashes the dataset's object and refuses the run, with the reason, when it is
     not the one validated (replaced in storage after its commit).
- Local compute check messages name no path of the control plane's host (a tenant reads them).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests

from shared.org_storage.base import upload_key
from shared.providers.local.checks import run_checks
from shared.store import get_store
from tests.fakes import Cloud
from tests.harness import Harness

ROOT_KEYS = {"region_name": "us-east-1", "aws_access_key_id": "AKIAROOT0000", "aws_secret_access_key": "x" * 40}
GOOD = b'{"text": "the validated dataset"}\n'


@pytest.fixture
def s3h(env: dict[str, str], fresh_s3_url: str) -> Iterator[Harness]:
    harness = Harness()
    conn = harness.save_storage({"kind": "s3", "endpoint": fresh_s3_url, "region": "us-east-1",
                                 "bucket": "tensorant-data", "prefix": "org-a", "access_key_id": "AKIATESTKEY00001",
                                 "secret_access_key": "s3cr3t-Access-Key-For-Tests-0123456789ab"})
    assert conn["status"] == "connected", conn
    yield harness
    harness.close()


def _bucket(url: str) -> dict[str, bytes]:
    s3 = boto3.client("s3", endpoint_url=url, **ROOT_KEYS)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="tensorant-data").get("Contents", [])]
    return {k: s3.get_object(Bucket="tensorant-data", Key=k)["Body"].read() for k in keys}


def _committed(harness: Harness) -> tuple[dict[str, Any], dict[str, Any]]:
    project = harness.ok("POST", "/api/projects", json_body={"name": "direct"})["id"]
    grant = harness.ok("POST", f"/api/projects/{project}/datasets/upload-url", token="member")
    assert requests.put(grant["url"], data=GOOD, timeout=60).status_code == 200
    rec = harness.ok("POST", grant["commit"]["path"], token="member", json_body=grant["commit"]["body"])
    return grant, rec


@pytest.mark.parametrize("second", [b'{"text": "swapped"}\n', b'{"text": "ok"}\n{broken\n'],
                         ids=["valid", "invalid"])
def test_a_committed_dataset_cannot_change_through_its_upload_url(s3h: Harness, fresh_s3_url: str,
                                                                 second: bytes) -> None:
    grant, rec = _committed(s3h)
    stored = get_store().datasets.get(s3h.org, rec["id"]).storage_key
    before = _bucket(fresh_s3_url)
    assert before[f"org-a/{stored}"] == GOOD and rec["sha256"] == hashlib.sha256(GOOD).hexdigest()

    # The URL still accepts a PUT for its hour, but only into the staging key, which nobody reads again.
    assert requests.put(grant["url"], data=second, timeout=60).status_code == 200
    status, problem, _ = s3h.call("POST", grant["commit"]["path"], token="member", json_body=grant["commit"]["body"])
    assert status == 409, problem
    assert f"dataset version {rec['id']} is already committed" in problem["detail"]
    assert "datasets " not in problem["detail"] and "already exists" not in problem["detail"]  # no table named

    # The committed object is the validated one, the record unchanged, and the re-PUT object removed.
    after = _bucket(fresh_s3_url)
    assert after == {k: v for k, v in before.items() if not k.startswith("org-a/uploads/")}
    assert after[f"org-a/{stored}"] == GOOD
    assert get_store().datasets.get(s3h.org, rec["id"]).sha256 == hashlib.sha256(GOOD).hexdigest()


def test_a_commit_that_loses_the_race_writes_only_its_own_key(s3h: Harness, fresh_s3_url: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Two commits of one upload at once: both pass the "already committed?" look before either has a
    record. The loser must not touch the winner's object, and its 409 names no table."""
    from shared.services.api import projects

    grant, rec = _committed(s3h)
    stored = get_store().datasets.get(s3h.org, rec["id"]).storage_key
    project = stored.split("/")[1]
    # The loser: its look came before the winner's record, and it reads a different upload.
    monkeypatch.setattr(projects, "_dataset_exists", lambda ctx, org, dataset_id: False)
    boto3.client("s3", endpoint_url=fresh_s3_url, **ROOT_KEYS).put_object(
        Bucket="tensorant-data", Key=f"org-a/{upload_key(project, rec['id'])}", Body=b'{"text": "other"}\n')
    status, problem, _ = s3h.call("POST", grant["commit"]["path"], token="member", json_body=grant["commit"]["body"])
    assert status == 409 and "is already committed" in problem["detail"], problem
    assert "datasets " not in problem["detail"]
    after = _bucket(fresh_s3_url)
    assert after[f"org-a/{stored}"] == GOOD  # the winner's object is untouched
    # The loser's own copy was removed, and the staged object nobody reads again.
    assert [k for k in after if f"/{project}/" in k] == [f"org-a/{stored}"]


def test_each_commit_writes_a_key_of_its_own() -> None:
    from shared.org_storage.base import committed_dataset_key

    a, b = committed_dataset_key("p-1", "d-1", "c1"), committed_dataset_key("p-1", "d-1", "c2")
    assert a != b and a.startswith("datasets/p-1/d-1.") and a.endswith(".jsonl")


def test_launch_refuses_a_dataset_changed_after_validation(harness: Harness, cloud: Cloud, env: dict[str, str]) -> None:
    pid, dsid = harness.project_and_dataset()
    ok = harness.create_run("memory", "mem-a10", project=(pid, dsid))
    assert harness.launch(ok)["state"] == "provisioning"  # the unchanged dataset launches
    assert len(cloud.machines) == 1

    changed = harness.create_run("memory", "mem-a10", project=(pid, dsid))
    rec = get_store().datasets.get(harness.org, dsid)
    path = Path(env["TENSORANT_LOCAL_ROOT"]) / "storage" / harness.org / rec.storage_key
    path.write_bytes(path.read_bytes() + b'{"text": "slipped in after the commit"}\n')
    run = harness.launch(changed)
    assert run["state"] == "failed", run
    assert f"dataset version {dsid} changed in storage after it was validated" in run["reason"]
    assert f"validated sha256 {rec.sha256[:12]}" in run["reason"]
    assert len(cloud.machines) == 1  # no machine was made for it

    path.unlink()
    gone = harness.create_run("memory", "mem-a10", project=(pid, dsid))
    run = harness.launch(gone)
    assert run["state"] == "failed" and f"dataset version {dsid} is missing from storage" in run["reason"], run
    assert len(cloud.machines) == 1


# ---------------------------------------------------------------- no host paths in check messages


def _host_paths(tmp_path: Path) -> list[str]:
    return [str(tmp_path), sys.executable, str(Path(sys.executable).parent), str(Path(__file__).resolve().parent.parent)]


def test_local_compute_checks_through_the_api_name_no_host_path(env: dict[str, str], tmp_path: Path) -> None:
    harness = Harness()
    try:
        harness.save_storage({"kind": "local"})
        conn = harness.save_compute("local", {})
        assert conn["status"] == "connected", conn
        text = json.dumps(conn)
        assert "TENSORANT_LOCAL_ROOT" in text and "smoke trainer" in text
        for path in _host_paths(tmp_path):
            assert path not in text, (path, conn["checks"])
    finally:
        harness.close()


def test_failing_local_checks_say_what_to_fix_without_host_paths(tmp_path: Path) -> None:
    blocked = tmp_path / "local" / "machines"
    blocked.parent.mkdir()
    blocked.write_text("a file where the machines directory should be")
    repo = tmp_path / "repo"  # a checkout whose agent cannot import: its traceback names repo's files
    (repo / "machine" / "agent").mkdir(parents=True)
    (repo / "machine" / "__init__.py").write_text("")
    (repo / "machine" / "agent" / "__init__.py").write_text("")
    (repo / "machine" / "agent" / "main.py").write_text("import a_module_that_is_not_installed\n")
    checks = {c.name: c for c in run_checks(blocked, f"{sys.executable} -m shared.providers.local.trainer", repo)}

    assert checks["work_root"].status == "fail" and "TENSORANT_LOCAL_ROOT" in checks["work_root"].message
    assert checks["agent"].status == "fail"
    assert "no module named 'a_module_that_is_not_installed'" in checks["agent"].message
    assert "real LoRA trainer" in checks["trainer"].message
    for check in checks.values():
        for path in _host_paths(tmp_path):
            assert path not in check.message, (path, check)


def test_an_import_error_is_named_without_its_file() -> None:
    from shared.providers.local.checks import import_error

    trace = ('Traceback (most recent call last):\n  File "/srv/app/machine/agent/main.py", line 3\n'
             "ImportError: cannot import name 'x' from 'machine.agent' (/srv/app/machine/agent/__init__.py)\n")
    assert import_error(trace) == "ImportError"
    assert import_error("") == "it failed"


def test_the_storage_location_conflict_names_no_host_path(env: dict[str, str], fresh_s3_url: str,
                                                          tmp_path: Path) -> None:
    from tests.harness import ApiError

    harness = Harness()
    try:
        harness.save_storage({"kind": "local"})
        harness.project_and_dataset()
        with pytest.raises(ApiError) as err:
            harness.ok("PUT", "/api/connections/storage", json_body={
                "kind": "s3", "endpoint": fresh_s3_url, "region": "us-east-1", "bucket": "tensorant-data",
                "access_key_id": "AKIATESTKEY00001", "secret_access_key": "s3cr3t-Access-Key-For-Tests-0123456789ab"})
        text = json.dumps(err.value.body)
        assert err.value.status == 409 and "local storage directory" in text, text
        for path in _host_paths(tmp_path):
            assert path not in text, path
    finally:
        harness.close()
