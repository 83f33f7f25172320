"""/api/openapi.json, generated from the registered functions and their pydantic models.

Paths and methods come from the FunctionApp itself (no second list of routes); summaries,
bodies and success statuses come from each handler's @http.api mark. What a mark does not
say is derived, by these rules:

- tag: the route's first segment (TAGS gives their order, user-facing runs first, and their
  descriptions; a new segment becomes its own tag after those).
- security: none when the mark says auth None (the docs routes), the run's agent token under
  agent/, a user token elsewhere.
- error responses (problem+json), each with its status: 500 always; 401, 403 and 503 (the
  state store unreachable) when a token is needed; 409 for a write that needs a token (state
  conflicts, concurrent writes); 404 and 422 when the path names something; 422 when there is a
  query parameter (QUERY) to validate; 400, 413 and 422 with a request body (Content-Length not
  a number, over the limit, invalid), and 411 with an upload (a raw body needs Content-Length).
  What a service answers beyond these (a rate limit's 429, a 404 for an id in the body, a GET's
  409) is listed by operation in MORE_ERRORS.
- bodies: a pydantic model is application/json; a media type string ("application/zip",
  "application/x-ndjson") is a raw body of that type; "provider config" is the compute
  connection body, one schema per provider in the registry (oneOf); "storage config" is the
  storage connection body (oneOf on `kind`); "adapter download" is the adapter archive or its
  download link; "docs asset" the docs page's files. A tuple lists several accepted bodies.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, TypeAdapter

from shared.function_index import functions_of
from shared.models import CONNECTION_NAME_PATTERN, CONNECTION_PATTERN, Problem
from shared.org_storage.config import StorageConfig
from shared.org_storage.registry import storage_config_models
from shared.providers import registry
from shared.settings import get_settings

PROBLEM = "application/problem+json"
REF = "#/components/schemas/{model}"

TAGS: list[tuple[str, str]] = [
    ("runs", "Training runs: save a draft with its price estimate, launch it, follow it, cancel, recover."),
    ("projects", "Projects and their dataset versions (JSONL uploads, each line validated)."),
    ("connections", "Compute and storage connections. Owners save them; secrets are never returned."),
    ("catalog", "GPU offers of the saved compute connections, with their price per hour."),
    ("agent", "Called by the agent on the training machine, with the run's own token."),
    ("platform", "Operator endpoints: queues, poison messages, the sweeper (admins)."),
    ("docs", "This reference and its machine-readable document."),
]
TAG_OF_SEGMENT = {"openapi.json": "docs"}

SUCCESS = {200: "OK", 201: "Created", 202: "Accepted: the work continues in the background", 204: "No content"}
ERRORS: dict[int, tuple[str, str]] = {
    400: ("Bad request", "Content-Length must be the body's size in bytes"),
    401: ("Unauthorized", "send Authorization: Bearer <token> (mint one with `tensorant dev-token`)"),
    403: ("Forbidden", "this needs the owner role; your token has member"),
    404: ("Not found", "no run r-0123456789 in this organization"),
    409: ("Conflict", "the run is training; cancel with discard: true to release its machine and disk"),
    411: ("Length required", "send a Content-Length header with the dataset (uploads are not chunked); at most 90 MiB"),
    413: ("Payload too large", "the JSON body is 2097152 bytes, over the 1 MiB this endpoint takes"),
    422: ("Invalid input", "fix these fields and send again: price_limit_per_hour: Input should be greater than 0"),
    429: ("Too many requests", "more than 10 run creates in a minute for this organization; try again in 12 s"),
    500: ("Internal error", "the control plane failed; the error is logged with this request"),
    503: ("Service unavailable", "the control plane's state store (Azure Storage tables and queues) cannot be "
                                "reached; the request may not have completed: send it again in 5 s"),
}
ERROR_TEXT = {400: "Malformed request (a Content-Length that is not the body's size)", 401: "No valid token",
              403: "The token may not do this", 404: "Not found",
              409: "Refused in the current state; nothing was changed", 411: "An upload needs a Content-Length header",
              413: "The body is over this endpoint's limit", 422: "Invalid input, naming the fields to fix",
              429: "Rate limited: send it again after Retry-After seconds", 500: "Internal error",
              503: "The state store cannot be reached: send it again after Retry-After seconds"}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before sending the request again",
                               "schema": {"type": "string", "pattern": "^[0-9]+$"}}}

# What an operation answers beyond the rules in the module's docstring, by operationId: what
# its service raises that the route cannot show. tests/test_openapi.py checks every name here.
MORE_ERRORS: dict[str, set[int]] = {
    "create_run": {404, 429},  # the body's project or dataset version unknown; run creates per minute
    "forecast_run": {404},  # the body's project or dataset version unknown (not rate limited)
    "launch_run": {429},  # run launches per minute
    "recover_run": {429},
    "release_run": {429},
    "check_compute": {429},
    "dataset_upload_url": {429},
    "upload_dataset": {429},  # dataset uploads and commits per minute
    "commit_dataset": {429},
    "run_metrics": {429},  # heavy reads per minute
    "get_storage": {404},  # no storage connection saved
    "runpod_volumes": {404, 409},  # no RunPod connection saved, or RunPod refused the listing
    "run_adapter": {404, 409},  # no merged model (format=merged); not succeeded (yet), or the stored file gone or changed
    "list_runs": {400},  # a cursor this list did not make
    "list_projects": {400},
    "list_datasets": {400},
    "gpus": {404},  # no connection saved for ?provider=
}

# Every paginated list's parameters (shared/services/api/paging.py); a bad cursor is a 400 naming it.
PAGE_PARAMS: list[dict[str, Any]] = [
    {"name": "limit", "schema": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
     "description": "items per page"},
    {"name": "cursor", "schema": {"type": "string"},
     "description": "the `next` of the previous page, unchanged (null on the last page)"},
]

# Query parameters, by operationId (the handlers read them from req.params).
QUERY: dict[str, list[dict[str, Any]]] = {
    "run_logs": [
        {"name": "after", "schema": {"type": "string", "pattern": "^[0-9]{1,10}$"},
         "description": "the cursor a previous page returned as `next` (a line number)"},
        {"name": "limit", "schema": {"type": "integer", "minimum": 1, "maximum": 5000, "default": 1000},
         "description": "lines per page"},
    ],
    "run_metrics": [{"name": "after", "schema": {"type": "string", "pattern": "^[0-9]{1,10}$"},
                     "description": "read the 2000 log lines after this one (a previous answer's `next`); the newest "
                                    "2000 when omitted"}],
    "list_runs": [
        *PAGE_PARAMS,
        {"name": "state", "schema": {"type": "string"}, "example": "training,retained",
         "description": "only runs in these states (comma-separated)"},
        {"name": "project", "schema": {"type": "string"}, "description": "only this project's runs"},
    ],
    "list_projects": PAGE_PARAMS,
    "list_datasets": PAGE_PARAMS,
    "run_adapter": [{"name": "format", "schema": {"type": "string", "enum": ["adapter", "merged"], "default": "adapter"},
                     "description": "merged: the adapter merged into the base model's weights (training.merged)"}],
    "get_usage": [{"name": "since", "schema": {"type": "string"}, "example": "2026-01-01",
                   "description": "an ISO date or date-time; 30 days ago when omitted"}],
    "gpus": [
        {"name": "provider", "schema": {"type": "string"}, "description": "only this provider's offers"},
        {"name": "connection", "schema": {"type": "string", "pattern": CONNECTION_PATTERN}, "example": "aws/us-west-2",
         "description": "only this compute connection's offers: `{provider}` (the default) or `{provider}/{name}`"},
        {"name": "base_model", "schema": {"type": "string"},
         "description": "a declared base model: each offer says whether a LoRA run of it fits"},
    ],
}

# Raw bodies named by media type in a mark.
MEDIA: dict[str, dict[str, Any]] = {
    "application/x-ndjson": {
        "schema": {"type": "string", "description": "JSON Lines: one example per line, each "
                   '{"messages": [{"role", "content"}...]}, {"prompt", "completion"} or {"text"}; or, for '
                   'training.method dpo, every line a preference pair: {"prompt", "chosen", "rejected"} or '
                   '{"messages" (ending before the answer), "chosen", "rejected"} (each an assistant turn)'},
        "example": '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}\n'
                   '{"prompt": "2+2=", "completion": "4"}\n',
    },
    "application/zip": {"schema": {"type": "string", "format": "binary",
                                   "description": "adapter.zip: adapter_config.json, adapter_model.safetensors, "
                                                  "manifest.json"}},
    "application/json": {"schema": {}},
    "text/html": {"schema": {"type": "string"}},
    "text/plain": {"schema": {"type": "string"}},
    "text/css": {"schema": {"type": "string"}},
    "text/javascript": {"schema": {"type": "string"}},
}

_SHA = "3f" * 32
# One example per request body model, by schema name; tests/test_openapi.py validates each against its model.
EXAMPLES: dict[str, Any] = {
    "ProjectCreate": {"name": "support-bot"},
    "RunCreate": {"project_id": "support-bot-1a2b", "kind": "trial", "provider": "aws",
                  "offer_id": "us-east-1/g6.xlarge", "price_limit_per_hour": 1.5,
                  "dataset_version_id": "ds-20250101-1a2b3c", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"},
    "RunPatch": {"price_limit_per_hour": 2.0},
    "RunLaunch": {"confirm": True},
    "RunCancel": {"discard": True},
    "RunRecover": {"mode": "verify_saved"},
    "Heartbeat": {"phase": "training", "progress": 0.42, "logs": ["progress=0.42 step=84 loss=1.731 lr=0.0002"]},
    "AgentComplete": {"status": "ok", "sha256": _SHA, "size": 1843201},
    "SweepRequest": {"dry_run": True},
    "ReplayRequest": {"message_id": None},
    # compute connections: in each provider's registry entry (shared/providers/<name>/__init__.py)
    # storage connections
    "LocalStorageConfig": {"kind": "local", "directory": ""},
    "S3StorageConfig": {"kind": "s3", "region": "us-east-1", "bucket": "tensorant-adapters", "prefix": "org-a",
                        "access_key_id": "AKIAIOSFODNN7EXAMPLE", "secret_access_key": "<secret>"},
    "RunPodVolumeConfig": {"kind": "runpod_volume", "volume_id": "a1b2c3d4e5", "datacenter_id": "EU-RO-1",
                           "access_key_id": "user_2abc", "secret_access_key": "<secret>"},
}


class _Doc:
    """One document being built: its component schemas."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def ref(self, model: type[BaseModel]) -> dict[str, Any]:
        schema = model.model_json_schema(ref_template=REF)
        self.schemas.update(schema.pop("$defs", {}))
        self.schemas[model.__name__] = schema
        return {"$ref": REF.format(model=model.__name__)}

    def adapter(self, adapter: TypeAdapter[Any]) -> dict[str, Any]:
        schema = adapter.json_schema(ref_template=REF)
        self.schemas.update(schema.pop("$defs", {}))
        return schema


def _example(model: type[BaseModel]) -> dict[str, Any]:
    return {"example": EXAMPLES[model.__name__]} if model.__name__ in EXAMPLES else {}


# How a saved secret is kept (shared.services.api.connections._keep_existing_secrets).
KEEP_SECRET_NOTE = ('Secrets (format "password") are write-only: the connection is shown with {"set": true} in their '
                    'place. Saving with a secret omitted, or with {"set": true} as its value, keeps the saved secret; '
                    'a string replaces it.')


def _provider_config(doc: _Doc) -> dict[str, Any]:
    models = {name: registry.config_model(name) for name in registry.compute_names()}
    examples = {name: {"summary": f"{name} connection", "value": value}
                for name in models if (value := registry.example(name)) is not None}
    return {"application/json": {
        "schema": {"description": "The body for the provider named in the path: one schema per provider "
                                  "(x-provider-schemas names which). " + KEEP_SECRET_NOTE,
                   "oneOf": [doc.ref(m) for m in models.values()],
                   # Which schema is whose: a form built from this document needs it (the console's).
                   "x-provider-schemas": {name: doc.ref(m) for name, m in models.items()}},
        "examples": examples}}


def _storage_config(doc: _Doc) -> dict[str, Any]:
    from typing import Annotated, Union, get_args

    from pydantic import Field

    # In production without the dev-only kinds (local storage), as the save refuses them there.
    members = storage_config_models(get_settings())
    examples = {m.__name__: {"summary": f"kind {m.model_fields['kind'].default}", "value": EXAMPLES[m.__name__]}
                for m in members if m.__name__ in EXAMPLES}
    union: Any = StorageConfig if len(members) == len(get_args(get_args(StorageConfig)[0])) else \
        Annotated[Union[tuple(members)], Field(discriminator="kind")]  # noqa: UP007 (a runtime union)
    schema = {**doc.adapter(TypeAdapter(union)), "description": "The storage kind's fields (`kind` says which). "
              + KEEP_SECRET_NOTE}
    return {"application/json": {"schema": schema, "examples": examples}}


def _adapter_download(doc: _Doc) -> dict[str, Any]:
    # Local storage answers the archive itself; S3 and RunPod volume storage a short-lived link.
    link = {"type": "object", "required": ["url", "expires_at", "sha256", "size"], "properties": {
        "url": {"type": "string", "description": "a presigned GET URL of adapter.zip"},
        "expires_at": {"type": "string", "format": "date-time"},
        "sha256": {"type": "string", "description": "the verified archive's sha256 (hex)"},
        "size": {"type": "integer", "description": "the archive's size in bytes"}}}
    return {"application/zip": {"schema": {**MEDIA["application/zip"]["schema"], "description": (
                "adapter.zip (local storage), with headers X-Adapter-Sha256 and Content-Disposition")}},
            "application/json": {"schema": link}}


def _docs_asset(doc: _Doc) -> dict[str, Any]:
    return {media: dict(MEDIA[media]) for media in ("text/javascript", "text/css", "text/plain")}


NAMED_BODIES: dict[str, Callable[[_Doc], dict[str, Any]]] = {
    "provider config": _provider_config,
    "storage config": _storage_config,
    "adapter download": _adapter_download,
    "docs asset": _docs_asset,
}


def _content(body: Any, doc: _Doc) -> dict[str, Any]:
    """The OpenAPI `content` map for a mark's request or response value."""
    out: dict[str, Any] = {}
    for item in body if isinstance(body, tuple) else (body,):
        if isinstance(item, type) and issubclass(item, BaseModel):
            out["application/json"] = {"schema": doc.ref(item), **_example(item)}
        elif item in NAMED_BODIES:
            out.update(NAMED_BODIES[item](doc))
        elif item in MEDIA:
            out[item] = dict(MEDIA[item])
        else:
            raise ValueError(f"@http.api body {item!r} is not a pydantic model, a media type in shared.openapi.MEDIA "
                             f"or one of {', '.join(NAMED_BODIES)}")
    return out


def _tag(route: str) -> str:
    segment = route.split("/")[0]
    return TAG_OF_SEGMENT.get(segment, segment)


def _is_upload(body: Any) -> bool:
    """A raw body (a media type other than JSON): read by http.upload_body, which needs Content-Length."""
    return any(isinstance(item, str) and item in MEDIA and item != "application/json"
               for item in (body if isinstance(body, tuple) else (body,)))


def _errors(op_id: str, mark: dict[str, Any], method: str, auth: str | None, has_params: bool) -> list[int]:
    codes = {500}
    if auth:
        codes |= {401, 403, 503}
        if method != "get":
            codes.add(409)
    if has_params:
        codes |= {404, 422}
    if op_id in QUERY:
        codes.add(422)
    if mark.get("request"):
        codes |= {400, 413, 422}
        if _is_upload(mark["request"]):
            codes.add(411)
    return sorted(codes | MORE_ERRORS.get(op_id, set()))


def _responses(mark: dict[str, Any], errors: list[int], doc: _Doc, problem: dict[str, Any]) -> dict[str, Any]:
    status = int(mark.get("status", 200))
    ok: dict[str, Any] = {"description": SUCCESS.get(status, "OK")}
    if status != 204:
        ok["content"] = _content(mark.get("response") or "application/json", doc)
    out = {str(status): ok}
    for code in errors:
        title, detail = ERRORS[code]
        out[str(code)] = {"description": ERROR_TEXT[code], "content": {PROBLEM: {"schema": problem, "example": {
            "type": "about:blank", "title": title, "status": code, "detail": detail, "errors": (
                [{"field": "price_limit_per_hour", "message": "Input should be greater than 0"}] if code == 422 else [])}}}}
        if code in (429, 503):
            out[str(code)]["headers"] = RETRY_AFTER
    return out


def _parameters(route: str, op_id: str) -> list[dict[str, Any]]:
    def with_providers(name: str, schema: dict[str, Any]) -> dict[str, Any]:
        # A provider, in the path or the query, is one of the registry's: the document follows it.
        if name == "name" and "/named/{name}" in route:  # a named compute connection's name
            return {**schema, "pattern": CONNECTION_NAME_PATTERN}
        return {**schema, "enum": registry.compute_names()} if name == "provider" else schema

    params = [{"name": name, "in": "path", "required": True, "schema": with_providers(name, {"type": "string"})}
              for name in re.findall(r"{(\w+)", route)]
    return params + [{"in": "query", "required": False, **p, "schema": with_providers(p["name"], p["schema"])}
                     for p in QUERY.get(op_id, [])]


def build(app: Any) -> dict[str, Any]:
    doc = _Doc()
    problem = doc.ref(Problem)
    paths: dict[str, Any] = {}
    for fn in functions_of(app):
        trigger = fn.get_trigger().get_dict_repr()
        if trigger.get("type") != "httpTrigger":
            continue
        route = str(trigger["route"])
        mark = getattr(fn.get_user_function(), "__api__", {})
        tag = _tag(route)
        auth = mark.get("auth", "agent" if tag == "agent" else "user")
        op_id = fn.get_function_name()
        params = _parameters(route, op_id)
        in_path = any(p["in"] == "path" for p in params)
        for method in trigger.get("methods") or ["GET"]:
            m = str(getattr(method, "value", method)).lower()
            op: dict[str, Any] = {
                "tags": [tag],
                "operationId": op_id,
                "summary": mark.get("summary", ""),
                "parameters": params,
                "security": [{auth: []}] if auth else [],
                "responses": _responses(mark, _errors(op_id, mark, m, auth, in_path), doc, problem),
            }
            if mark.get("request"):
                op["requestBody"] = {"required": True, "content": _content(mark["request"], doc)}
            paths.setdefault("/api/" + re.sub(r"{(\w+):\w+}", r"{\1}", route), {})[m] = op
    used = {op["tags"][0] for ops in paths.values() for op in ops.values()}
    known = [name for name, _ in TAGS]
    tags = [{"name": n, "description": d} for n, d in TAGS if n in used]
    tags += [{"name": n} for n in sorted(used - set(known))]
    return {
        "openapi": "3.1.0",
        "info": {"title": "Tensorant control plane", "version": "1",
                 "description": "Fine-tuning runs on your own cloud accounts: a draft shows its price, a launch "
                                "rents the machine, the adapter is verified before the machine is released."},
        "tags": tags,
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": doc.schemas, "securitySchemes": {
            "user": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                     "description": "A user token (`tensorant dev-token` mints one locally)."},
            "agent": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                      "description": "The run's own agent token, handed to the training machine at launch."}}},
    }
