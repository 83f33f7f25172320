"""Request bodies are bounded before they are read, datasets stream to storage.

- a Content-Length over the limit is 413 problem+json without reading the body; a missing one
  on an upload is 411, a malformed one 400; JSON bodies are capped too;
- limits stay under the Functions host's 100 MB request limit (datasets and recovery uploads 90 MiB);
- a 20 MiB dataset upload allocates far less than its own size again (one pass: hashed,
  checked line by line and written in chunks; no decoded copy, no list of lines);
- large datasets go straight to storage: upload-url (presigned PUT) + commit, which streams
  the object from storage through the same checks;
- the adapter verifier unpacks at most 1 GiB (it held up to 2 GiB).
"""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from typing import Any

import azure.functions as func
import boto3
import pytest
import requests

from shared import http
from shared.store import get_store
from tests.harness import Harness

MiB = 1024 * 1024


class NoBodyRequest:
    """A request whose body must not be read (a 300 GB upload, as its Content-Length says)."""

    def __init__(self, token: str, content_length: str | None, route_params: dict[str, str]) -> None:
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"}
        if content_length is not None:
            self.headers["Content-Length"] = content_length
        self.route_params = route_params
        self.params: dict[str, str] = {}
        self.read = False

    def get_body(self) -> bytes:
        self.read = True
        raise MemoryError("the body was read")


def _handler(harness: Harness, method: str, route: str) -> Any:
    for m, template, fn in harness.routes:
        if m == method and template.match(route) is not None:
            return fn
    raise AssertionError(route)


def _problem(resp: Any) -> dict[str, Any]:
    assert resp.headers["Content-Type"] == http.PROBLEM
    body: dict[str, Any] = json.loads(resp.get_body())
    return body


def test_limits_stay_under_the_functions_host_request_limit() -> None:
    assert http.MAX_UPLOAD_BYTES == 90 * MiB < 100_000_000
    assert http.MAX_JSON_BYTES <= MiB


@pytest.mark.parametrize("route", ["projects/p-000000000000/datasets", "runs/r-000000000000/recover"])
def test_a_huge_content_length_is_refused_without_reading(harness: Harness, route: str) -> None:
    req = NoBodyRequest(harness.member, str(300 * 10**9), {"id": route.split("/")[1]})
    if route.startswith("runs"):
        req.headers["Content-Type"] = "application/zip"
    resp = _handler(harness, "POST", route)(req)
    assert resp.status_code == 413, resp.get_body()
    body = _problem(resp)
    assert body["status"] == 413 and "300000000000 bytes, over the 90 MiB" in body["detail"]
    assert not req.read


def test_json_bodies_are_capped_before_reading(harness: Harness) -> None:
    req = NoBodyRequest(harness.member, str(50 * MiB), {})
    req.headers["Content-Type"] = "application/json"
    resp = _handler(harness, "POST", "runs")(req)
    assert resp.status_code == 413 and not req.read


def test_an_upload_needs_a_valid_content_length(harness: Harness) -> None:
    missing = NoBodyRequest(harness.member, None, {"id": "p-000000000000"})
    resp = _handler(harness, "POST", "projects/p-000000000000/datasets")(missing)
    assert resp.status_code == 411 and "Content-Length" in _problem(resp)["detail"] and not missing.read
    bad = NoBodyRequest(harness.member, "12abc", {"id": "p-000000000000"})
    resp = _handler(harness, "POST", "projects/p-000000000000/datasets")(bad)
    assert resp.status_code == 400 and not bad.read


def _dataset(size: int) -> bytes:
    line = json.dumps({"messages": [{"role": "user", "content": "q" * 40},
                                    {"role": "assistant", "content": "a" * 40}]}).encode() + b"\n"
    return line * (size // len(line))


def test_a_20_mib_upload_allocates_far_less_than_its_size(harness: Harness) -> None:
    project = harness.ok("POST", "/api/projects", json_body={"name": "big"})["id"]
    data = _dataset(20 * MiB)
    req = func.HttpRequest("POST", f"http://localhost/api/projects/{project}/datasets", body=data,
                           headers={"Authorization": f"Bearer {harness.member}", "Content-Length": str(len(data)),
                                    "Content-Type": "application/x-ndjson"}, route_params={"id": project})
    handler = _handler(harness, "POST", f"projects/{project}/datasets")
    tracemalloc.start()
    try:
        resp = handler(req)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert resp.status_code == 201, resp.get_body()
    rec = json.loads(resp.get_body())
    assert rec["size_bytes"] == len(data) and rec["sha256"] == hashlib.sha256(data).hexdigest()
    assert rec["rows"] == data.count(b"\n")
    print(f"\n20 MiB dataset upload: peak Python allocation {peak / MiB:.1f} MiB ({peak / len(data):.2f}x the body)")
    assert peak < 0.25 * len(data)  # it was over 2x: a decoded copy plus a list of every line


def test_line_errors_keep_their_wording_and_store_nothing(harness: Harness, env: dict[str, str]) -> None:
    from pathlib import Path

    project = harness.ok("POST", "/api/projects", json_body={"name": "bad"})["id"]
    good = json.dumps({"text": "ok"})
    body = "\n".join([good, "{not json", good, json.dumps({"messages": []})]).encode()
    status, problem, _ = harness.call("POST", f"/api/projects/{project}/datasets", body=body,
                                content_type="application/x-ndjson")
    assert status == 422
    assert problem["detail"].startswith("2 of 4 lines are not valid examples (each is listed)")
    assert [e["line"] for e in problem["errors"]] == [2, 4]
    assert problem["errors"][0]["message"].startswith("is not valid JSON")  # said once, by its field "line 2"
    status, problem, _ = harness.call("POST", f"/api/projects/{project}/datasets", body=good.encode() + b"\n\xff\xfe",
                                content_type="application/x-ndjson")
    assert status == 422 and any("not UTF-8 (byte 15)" in e["message"] for e in problem["errors"]), problem
    stored = Path(env["TENSORANT_LOCAL_ROOT"]) / "storage" / harness.org / "datasets"
    assert not [p for p in stored.rglob("*") if p.is_file()]
    status, problem, _ = harness.call("POST", f"/api/projects/{project}/datasets/upload-url")
    assert status == 409 and "local storage" in problem["detail"]


def test_direct_upload_to_s3_then_commit_streams_and_validates(env: dict[str, str], fresh_s3_url: str) -> None:
    h = Harness()
    try:
        conn = h.save_storage({"kind": "s3", "endpoint": fresh_s3_url, "region": "us-east-1", "bucket": "tensorant-data",
                               "prefix": "org-a", "access_key_id": "AKIATESTKEY00001",
                               "secret_access_key": "s3cr3t-Access-Key-For-Tests-0123456789ab"})
        assert conn["status"] == "connected", conn
        project = h.ok("POST", "/api/projects", json_body={"name": "direct"})["id"]
        data = _dataset(9 * MiB)  # over one 8 MiB part: the copy to the dataset key is a multipart upload
        grant = h.ok("POST", f"/api/projects/{project}/datasets/upload-url", token="member")
        assert grant["method"] == "PUT" and grant["max_bytes"] >= 256 * MiB
        assert requests.put(grant["url"], data=data, timeout=60).status_code == 200
        rec = h.ok("POST", grant["commit"]["path"], token="member", json_body=grant["commit"]["body"])
        assert rec["id"] == grant["dataset_id"] and rec["rows"] == data.count(b"\n")
        assert rec["sha256"] == hashlib.sha256(data).hexdigest() and rec["size_bytes"] == len(data)
        stored = get_store().datasets.get(h.org, rec["id"]).storage_key
        keys = [o["Key"] for o in boto3.client(
            "s3", endpoint_url=fresh_s3_url, region_name="us-east-1", aws_access_key_id="AKIAROOT0000",
            aws_secret_access_key="x" * 40).list_objects_v2(Bucket="tensorant-data").get("Contents", [])]
        # The commit's own key (so a later commit of the same dataset cannot write over it).
        assert [k for k in keys if k.startswith(f"org-a/datasets/{project}/{rec['id']}.")] == [f"org-a/{stored}"]
        assert not [k for k in keys if k.startswith("org-a/uploads/")]  # the staged object is gone
        # The URL wrote only the staging key: using it again cannot change the committed dataset
        # (tests/test_security_datasets.py checks the object and the 409's words).
        assert requests.put(grant["url"], data=b'{"text": "swapped"}\n', timeout=60).status_code == 200
        status, _, _ = h.call("POST", grant["commit"]["path"], token="member", json_body=grant["commit"]["body"])
        assert status == 409  # committed already
        # An invalid upload is refused at commit and nothing is kept.
        grant = h.ok("POST", f"/api/projects/{project}/datasets/upload-url", token="member")
        requests.put(grant["url"], data=b'{"text": "ok"}\n{broken\n', timeout=60)
        status, problem, _ = h.call("POST", grant["commit"]["path"], token="member", json_body=grant["commit"]["body"])
        assert status == 422 and "1 of 2 lines are not valid examples" in problem["detail"]
        status, _, _ = h.call("POST", grant["commit"]["path"], token="member", json_body=grant["commit"]["body"])
        assert status == 409  # the staged object was removed
    finally:
        h.close()


def test_the_adapter_verifier_unpacks_at_most_1_gib() -> None:
    from adapter_format import verify

    assert verify.MAX_TOTAL_BYTES <= 1024 * MiB
