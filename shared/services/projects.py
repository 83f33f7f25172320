"""Projects and dataset versions (JSONL uploads, validated line by line)."""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

from shared.clock import now
from shared.errors import InvalidInput
from shared.models import DatasetVersionRecord, ProjectCreate, ProjectRecord, Role
from shared.security import Principal, require
from shared.services.backends import storage_for
from shared.storage.base import dataset_key
from shared.store import get_store

MAX_DATASET_BYTES = 256 * 1024 * 1024
MAX_REPORTED_LINES = 20
ROLES = {"system", "user", "assistant", "tool"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def create_project(principal: Principal, body: ProjectCreate) -> ProjectRecord:
    require(principal, Role.owner, Role.member)
    storage_for(principal.org)  # a project needs storage: fail now, not at the first upload
    rec = ProjectRecord(org=principal.org, id=new_id("p"), name=body.name, created_at=now())
    get_store().create_project(rec)
    return rec


def list_projects(principal: Principal) -> dict[str, Any]:
    return {"items": get_store().list_projects(principal.org)}


def line_problem(obj: Any) -> str | None:
    """Why a dataset line is not a training example, or None. Accepted shapes:
    {"messages": [{"role", "content"}, ...]}, {"prompt", "completion"}, {"text"}."""
    if not isinstance(obj, dict):
        return "is not a JSON object"
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            return "\"messages\" must be a non-empty list"
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                return f"messages[{i}] needs a role ({', '.join(sorted(ROLES))}) and a string content"
        if not any(m["role"] == "assistant" for m in msgs):
            return "has no assistant message to learn from"
        return None
    if "prompt" in obj or "completion" in obj:
        if not isinstance(obj.get("prompt"), str) or not isinstance(obj.get("completion"), str):
            return "\"prompt\" and \"completion\" must both be strings"
        return None
    if "text" in obj:
        return None if isinstance(obj["text"], str) and obj["text"] else "\"text\" must be a non-empty string"
    return "needs \"messages\", \"prompt\"+\"completion\" or \"text\""


def validate_jsonl(data: bytes) -> int:
    if not data.strip():
        raise InvalidInput.field("body", "the dataset is empty; upload JSONL with one example per line")
    if len(data) > MAX_DATASET_BYTES:
        raise InvalidInput.field("body", f"the dataset is over {MAX_DATASET_BYTES // 2**20} MiB; split it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput.field("body", f"the dataset is not UTF-8 (byte {exc.start}); re-save it as UTF-8") from exc
    rows, errors = 0, list[dict[str, Any]]()
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            problem = line_problem(json.loads(line))
        except json.JSONDecodeError as exc:
            problem = f"is not valid JSON ({exc.msg})"
        if problem:
            # The field names the line; the message is only what is wrong with it, so a client
            # that prints "field: message" says "line 2: is not valid JSON", once.
            errors.append({"field": f"line {n}", "line": n, "message": problem})
        rows += 1
    if errors:
        shown = errors[:MAX_REPORTED_LINES]
        listed = f"the first {len(shown)} are listed" if len(errors) > len(shown) else "each is listed"
        raise InvalidInput(f"{len(errors)} of {rows} lines are not valid examples ({listed}); fix them and "
                           "upload again", errors=shown)
    return rows


def upload_dataset(principal: Principal, project_id: str, data: bytes) -> DatasetVersionRecord:
    require(principal, Role.owner, Role.member)
    store = get_store()
    store.get_project(principal.org, project_id)
    rows = validate_jsonl(data)
    dataset_id = new_id("d")
    key = dataset_key(project_id, dataset_id)
    storage_for(principal.org).put(key, data)  # stored before the record: a crash leaves an unused object, not a dangling record
    rec = DatasetVersionRecord(org=principal.org, project_id=project_id, id=dataset_id, rows=rows,
                               sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data), storage_key=key,
                               created_at=now())
    store.create_dataset(rec)
    return rec


def list_datasets(principal: Principal, project_id: str) -> dict[str, Any]:
    get_store().get_project(principal.org, project_id)
    return {"items": get_store().list_datasets(principal.org, project_id)}
