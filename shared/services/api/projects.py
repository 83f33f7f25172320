"""Projects and dataset versions (JSONL uploads, validated line by line)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import secrets
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, Field

from shared.clock import now
from shared.context import Context
from shared.errors import Conflict, InvalidInput, NotFound, PermanentError
from shared.ids import new_id
from shared.limits import MAX_UPLOAD_BYTES
from shared.models import ID_PATTERN, DatasetVersionRecord, ProjectCreate, ProjectRecord, Role
from shared.org_storage.base import STREAM_CHUNK, ObjectMissing, committed_dataset_key, dataset_key, upload_key
from shared.runs.org_backends import storage_for
from shared.security import Principal, require
from shared.services.api import paging, quotas

# Through the API a dataset is at most MAX_UPLOAD_BYTES (90 MiB, under the Functions
# host's request limit); a direct upload to storage (upload-url + commit) up to this.
MAX_DATASET_BYTES = 256 * 1024 * 1024
MAX_LINE_BYTES = 16 * 1024 * 1024
DIRECT_UPLOAD_TTL_S = 3600
MAX_REPORTED_LINES = 20
ROLES = {"system", "user", "assistant", "tool"}


def create_project(ctx: Context, principal: Principal, body: ProjectCreate) -> ProjectRecord:
    require(principal, Role.owner, Role.member)
    storage_for(ctx, principal.org)  # a project needs storage: fail now, not at the first upload
    rec = ProjectRecord(org=principal.org, id=new_id("p"), name=body.name, created_at=now())
    ctx.store.projects.create(rec)
    return rec


def list_projects(ctx: Context, principal: Principal, limit: str | None = None, cursor: str | None = None) -> dict[str, Any]:
    """One page of the org's projects in id order (paging: limit, cursor; `next` null on the last)."""
    page = paging.request(ctx, limit, cursor, "projects", principal.org)
    found, nxt = ctx.store.projects.page(principal.org, limit=page.limit, after=page.after)
    return {"items": found, "next": paging.cursor_for(ctx, nxt, "projects", principal.org)}


def line_problem(obj: Any) -> str | None:
    """Why a dataset line is not a training example, or None. Accepted shapes:
    {"messages": [{"role", "content"}, ...]}, {"prompt", "completion"}, {"text"}."""
    if not isinstance(obj, dict):
        return "is not a JSON object"
    if "messages" in obj:
        problem = _messages_problem(obj["messages"])
        if problem is None and not any(m["role"] == "assistant" for m in obj["messages"]):
            return "has no assistant message to learn from"
        return problem
    if "prompt" in obj or "completion" in obj:
        if not isinstance(obj.get("prompt"), str) or not isinstance(obj.get("completion"), str):
            return "\"prompt\" and \"completion\" must both be strings"
        return None
    if "text" in obj:
        return None if isinstance(obj["text"], str) and obj["text"] else "\"text\" must be a non-empty string"
    return "needs \"messages\", \"prompt\"+\"completion\" or \"text\""


def _messages_problem(msgs: Any) -> str | None:
    """Why a line's "messages" is not a non-empty list of {role, content} turns, or None."""
    if not isinstance(msgs, list) or not msgs:
        return "\"messages\" must be a non-empty list"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            return f"messages[{i}] needs a role ({', '.join(sorted(ROLES))}) and a string content"
    return None


def is_pair(obj: Any) -> bool:
    """A line that means to be a preference pair (it names chosen or rejected)."""
    return isinstance(obj, dict) and ("chosen" in obj or "rejected" in obj)


def pair_problem(obj: dict[str, Any]) -> str | None:
    """Why a preference-pair line is not one, or None. Accepted shapes:
    {"prompt": str, "chosen": str, "rejected": str}, and
    {"messages": [... ending with a user turn], "chosen": {"role": "assistant", "content": str},
    "rejected": {"role": "assistant", "content": str}} (the two answers to the same conversation)."""
    if "messages" in obj:
        problem = _messages_problem(obj["messages"]) or _answers_problem(obj)
        if problem is not None:
            return problem
    elif "prompt" in obj:
        for side in ("prompt", "chosen", "rejected"):
            if not isinstance(obj.get(side), str) or not obj[side]:
                return "\"prompt\", \"chosen\" and \"rejected\" must all be non-empty strings"
    else:
        return "a preference pair needs \"prompt\" (or \"messages\"), \"chosen\" and \"rejected\""
    if obj["chosen"] == obj["rejected"]:
        return "\"chosen\" and \"rejected\" are the same answer; a pair teaches nothing without a difference"
    return None


def _answers_problem(obj: dict[str, Any]) -> str | None:
    """Why a conversation pair's messages and answers are not a conversation ending before the answer and two
    assistant turns, or None."""
    if obj["messages"][-1]["role"] == "assistant":
        return "a pair's \"messages\" must end before the answer (the answers are \"chosen\" and \"rejected\")"
    for side in ("chosen", "rejected"):
        turn = obj.get(side)
        if not (isinstance(turn, dict) and turn.get("role") == "assistant" and isinstance(turn.get("content"), str)
                and turn["content"]):
            return f"\"{side}\" must be an assistant turn: {{\"role\": \"assistant\", \"content\": \"...\"}}"
    return None


class DatasetCommit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset_id: str = Field(pattern=ID_PATTERN, description="the dataset_id upload-url returned")


class CheckedJsonl:
    """A reader over a JSONL source that hashes every byte and checks each line as it passes,
    so a dataset streams to storage in one pass without a second copy in memory.

    Errors: a non-UTF-8 line or a dataset over max_bytes raise at once (from read());
    invalid example lines are collected and reported by finish(), all of them at once.
    """

    def __init__(self, source: BinaryIO, max_bytes: int) -> None:
        self.source = source
        self.max_bytes = max_bytes
        self.sha = hashlib.sha256()
        self.size = 0
        self.rows = 0
        self.pairs = 0  # rows that are preference pairs (DPO); a version is all pairs or all examples
        self._first_pair: bool | None = None  # the first row's kind: every other row must match it
        self.bad = 0
        self.errors: list[dict[str, Any]] = []  # the first MAX_REPORTED_LINES only
        self._partial = b""
        self._line_no = 0
        self._line_start = 0  # byte offset of the partial line

    def read(self, n: int = -1) -> bytes:
        chunk: bytes = self.source.read(n if n and n > 0 else STREAM_CHUNK)
        if chunk:
            self._feed(chunk)
        return chunk

    def _feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise InvalidInput.field("body", f"the dataset is over {self.max_bytes // 2**20} MiB; split it")
        self.sha.update(chunk)
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            line = self._partial + chunk[start:end] if self._partial else chunk[start:end]
            self._partial = b""
            self._line(line)
            self._line_start += len(line) + 1
            start = end + 1
        if start < len(chunk):
            self._partial += chunk[start:]
            if len(self._partial) > MAX_LINE_BYTES:
                raise InvalidInput.field("body", f"line {self._line_no + 1} is longer than "
                                         f"{MAX_LINE_BYTES // 2**20} MiB; one example per line")

    def _line(self, raw: bytes) -> None:
        self._line_no += 1
        n = self._line_no
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput.field("body", f"the dataset is not UTF-8 (byte {self._line_start + exc.start}); "
                                     "re-save it as UTF-8") from exc
        if not line.strip():
            return
        try:
            obj = json.loads(line)
            pair = is_pair(obj)
            problem = pair_problem(obj) if pair else line_problem(obj)
            self.pairs += pair
            if self._first_pair is None:
                self._first_pair = pair
            elif pair != self._first_pair and not problem:
                problem = ("is a preference pair among training examples" if pair else
                           "is a training example among preference pairs") + (
                    "; a dataset version is all pairs (for method dpo) or all examples (for sft): split it")
        except json.JSONDecodeError as exc:
            problem = f"is not valid JSON ({exc.msg})"
        if problem:
            self.bad += 1
            if len(self.errors) < MAX_REPORTED_LINES:
                self.errors.append({"field": f"line {n}", "line": n, "message": problem})
        self.rows += 1

    def finish(self) -> int:
        """After the source is read to its end: the rows, or the invalid lines as one 422."""
        if self._partial:
            self._line(self._partial)
            self._partial = b""
        if not self.rows:
            raise InvalidInput.field("body", "the dataset is empty; upload JSONL with one example per line")
        if self.bad:
            shown = self.errors
            listed = f"the first {len(shown)} are listed" if self.bad > len(shown) else "each is listed"
            raise InvalidInput(f"{self.bad} of {self.rows} lines are not valid examples ({listed}); fix them and "
                               "upload again", errors=shown)
        return self.rows


def _store_checked(ctx: Context, org: str, key: str, source: BinaryIO, max_bytes: int) -> CheckedJsonl:
    """Stream `source` into storage at `key` while checking it; nothing is kept if it is invalid."""
    storage = storage_for(ctx, org)
    checked = CheckedJsonl(source, max_bytes)
    storage.put_stream(key, checked)  # a line error raised while streaming leaves no object
    try:
        checked.finish()
    except InvalidInput:
        storage.delete(key)
        raise
    return checked


def _record(ctx: Context, principal: Principal, project_id: str, dataset_id: str, key: str, checked: CheckedJsonl
            ) -> DatasetVersionRecord:
    rec = DatasetVersionRecord(org=principal.org, project_id=project_id, id=dataset_id, rows=checked.rows,
                               sha256=checked.sha.hexdigest(), size_bytes=checked.size, storage_key=key,
                               created_at=now(), format="pairs" if checked.pairs else "examples")
    try:
        ctx.store.datasets.create(rec)  # after the object: a crash leaves an unused object, not a dangling record
    except Conflict as exc:
        # Another commit of this dataset won. The store's text names its table: say what happened instead.
        raise _already_committed(dataset_id) from exc
    return rec


def _already_committed(dataset_id: str) -> Conflict:
    return Conflict(f"dataset version {dataset_id} is already committed and cannot change; to add other data, ask "
                    "for a new upload URL (a new dataset version)")


def upload_dataset(ctx: Context, principal: Principal, project_id: str, data: bytes) -> DatasetVersionRecord:
    """A dataset sent in the request body (the HTTP layer caps it at MAX_UPLOAD_BYTES)."""
    require(principal, Role.owner, Role.member)
    ctx.store.projects.get(principal.org, project_id)
    quotas.take(ctx, principal, "upload")  # each streams up to 90 MiB through the checks into storage
    dataset_id = new_id("d")
    key = dataset_key(project_id, dataset_id)
    checked = _store_checked(ctx, principal.org, key, io.BytesIO(data), MAX_DATASET_BYTES)
    return _record(ctx, principal, project_id, dataset_id, key, checked)


def dataset_upload_url(ctx: Context, principal: Principal, project_id: str) -> dict[str, Any]:
    """A presigned PUT URL for a dataset too large for the API (S3 / RunPod volume storage);
    POST .../datasets/commit then validates the object in storage by streaming it."""
    require(principal, Role.owner, Role.member)
    ctx.store.projects.get(principal.org, project_id)
    quotas.take(ctx, principal, "upload-url")
    dataset_id = new_id("d")
    url = storage_for(ctx, principal.org).upload_url(upload_key(project_id, dataset_id), DIRECT_UPLOAD_TTL_S)
    if url is None:
        raise Conflict("this organization's storage takes no direct uploads (local storage); send the dataset "
                       f"in the body of POST /api/projects/{project_id}/datasets (up to "
                       f"{MAX_UPLOAD_BYTES // 2**20} MiB)")
    return {"dataset_id": dataset_id, "method": "PUT", "url": url, "expires_in_s": DIRECT_UPLOAD_TTL_S,
            "max_bytes": MAX_DATASET_BYTES,
            "commit": {"path": f"/api/projects/{project_id}/datasets/commit", "body": {"dataset_id": dataset_id}}}


def commit_dataset(ctx: Context, principal: Principal, project_id: str, body: Any) -> DatasetVersionRecord:
    """Validate a direct upload by streaming it from its staging key into a key of this commit's own.

    A committed dataset never changes: a commit of a dataset that has a record is refused before it
    reads the upload or writes any dataset object, and a commit never writes an existing object
    (committed_dataset_key is new per attempt), so neither a second PUT through the upload URL nor a
    concurrent commit can overwrite or delete the object a record names."""
    require(principal, Role.owner, Role.member)
    store = ctx.store
    store.projects.get(principal.org, project_id)
    quotas.take(ctx, principal, "upload")  # each streams up to 256 MiB from storage through the checks
    dataset_id = body.get("dataset_id") if isinstance(body, dict) else None
    if not isinstance(dataset_id, str) or not re.fullmatch(ID_PATTERN, dataset_id):
        raise InvalidInput.field("dataset_id", "send the dataset_id that upload-url returned")
    staged = upload_key(project_id, dataset_id)
    storage = storage_for(ctx, principal.org)
    if _dataset_exists(ctx, principal.org, dataset_id):
        # What the URL wrote after the commit is read by nobody: remove it rather than keep it.
        storage.delete(staged)
        raise _already_committed(dataset_id)
    try:
        source = storage.open_stream(staged, MAX_DATASET_BYTES)
    except ObjectMissing as exc:
        raise Conflict(f"nothing was uploaded for dataset {dataset_id}: PUT the file to the upload URL first") from exc
    except ValueError as exc:
        storage.delete(staged)
        raise InvalidInput.field("body", f"the dataset is over {MAX_DATASET_BYTES // 2**20} MiB; split it") from exc
    key = committed_dataset_key(project_id, dataset_id, secrets.token_hex(6))
    try:
        with source:
            checked = _store_checked(ctx, principal.org, key, source, MAX_DATASET_BYTES)
    except InvalidInput:
        storage.delete(staged)
        raise
    try:
        rec = _record(ctx, principal, project_id, dataset_id, key, checked)
    except Conflict:
        # A concurrent commit won: remove this attempt's own copy (no record names it) and the staged
        # object (the dataset is committed, so nothing reads it again).
        storage.delete(key)
        storage.delete(staged)
        raise
    storage.delete(staged)
    return rec


def _dataset_exists(ctx: Context, org: str, dataset_id: str) -> bool:
    try:
        ctx.store.datasets.get(org, dataset_id)
    except NotFound:
        return False
    return True


def list_datasets(ctx: Context, principal: Principal, project_id: str, limit: str | None = None,
                  cursor: str | None = None) -> dict[str, Any]:
    """One page of a project's dataset versions in id order (paging: limit, cursor)."""
    ctx.store.projects.get(principal.org, project_id)
    page = paging.request(ctx, limit, cursor, "datasets", principal.org, project_id)
    found, nxt = ctx.store.datasets.page(principal.org, project_id, limit=page.limit, after=page.after)
    return {"items": found, "next": paging.cursor_for(ctx, nxt, "datasets", principal.org, project_id)}


def check_stored_dataset(ctx: Context, org: str, dataset: DatasetVersionRecord) -> None:
    """Before a run gets a dataset: hash the object as stored and compare it with the sha256 recorded
    when it was validated; PermanentError (the launch step ends the run with this reason) if it changed.

    Streamed and hashed here rather than read from object metadata: S3 keeps no full-object sha256 of
    a multipart upload, RunPod's S3 API and a directory keep none at all, and a hash of the bytes is
    the only proof covering records made before this check. It reads at most MAX_DATASET_BYTES once per
    launch attempt, in STREAM_CHUNK pieces (seconds, against minutes to start a GPU machine). The
    machine downloads the dataset after this check, so an object replaced in between is caught only
    by the agent hashing what it downloaded (not done yet)."""
    def changed(now_is: str) -> PermanentError:
        return PermanentError(f"dataset version {dataset.id} changed in storage after it was validated ({now_is}, "
                              f"validated sha256 {dataset.sha256[:12]}...); the run does not train on it: upload the "
                              "dataset again as a new version and create a run with that version")

    try:
        source = storage_for(ctx, org).open_stream(dataset.storage_key, MAX_DATASET_BYTES)
    except ObjectMissing as exc:
        raise PermanentError(f"dataset version {dataset.id} is missing from storage; upload the dataset again as a "
                             "new version and create a run with that version") from exc
    except ValueError as exc:
        raise changed(f"now over {MAX_DATASET_BYTES // 2**20} MiB") from exc
    sha = hashlib.sha256()
    try:
        with source:
            while chunk := source.read(STREAM_CHUNK):
                sha.update(chunk)
    except ValueError as exc:  # it grew past the limit while it was read
        raise changed(f"now over {MAX_DATASET_BYTES // 2**20} MiB") from exc
    if sha.hexdigest() != dataset.sha256:
        raise changed(f"sha256 now {sha.hexdigest()[:12]}...")
