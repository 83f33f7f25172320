"""/api/openapi.json, generated from the registered functions and their pydantic models.

Paths and methods come from the FunctionApp itself (no second list of routes); summaries,
bodies and success statuses come from each handler's @http.api mark. What a mark does not
say is derived, by these rules:

- tag: the route's first segment (TAGS gives their order, user-facing runs first, and their
  descriptions; a new segment becomes its own tag after those).
- security: none when the mark says auth None (the docs routes), the run's agent token under
  agent/, a user token elsewhere.
- error responses (problem+json), unless the mark lists `errors`: 401 and 403 when a token is
  needed, 404 when the path names something, 409 for a write that needs a token (state
  conflicts), 422 when there is a body or a path parameter to validate, 500 always.
- bodies: a pydantic model is application/json; a media type string ("application/zip",
  "application/x-ndjson") is a raw body of that type; "provider config" is the compute
  connection body, one schema per provider in the registry (oneOf); "storage config" is the
  storage connection body (oneOf on `kind`). A tuple lists several accepted bodies.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, TypeAdapter

from shared.models import Problem

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
    401: ("Unauthorized", "send Authorization: Bearer <token> (mint one with `tensorant dev-token`)"),
    403: ("Forbidden", "this needs the owner role; your token has member"),
    404: ("Not found", "no run r-0123456789 in this organization"),
    409: ("Conflict", "the run is training; cancel with discard: true to release its machine and disk"),
    422: ("Invalid input", "fix these fields and send again: price_limit_per_hour: Input should be greater than 0"),
    500: ("Internal error", "the control plane failed; the error is logged with this request"),
}
ERROR_TEXT = {401: "No valid token", 403: "The token may not do this", 404: "Not found",
              409: "Refused in the current state; nothing was changed", 422: "Invalid input, naming the fields to fix",
              500: "Internal error"}

# Raw bodies named by media type in a mark.
MEDIA: dict[str, dict[str, Any]] = {
    "application/x-ndjson": {
        "schema": {"type": "string", "description": "JSON Lines: one example per line, each "
                   '{"messages": [{"role", "content"}...]}, {"prompt", "completion"} or {"text"}'},
        "example": '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}\n'
                   '{"prompt": "2+2=", "completion": "4"}\n',
    },
    "application/zip": {"schema": {"type": "string", "format": "binary",
                                   "description": "adapter.zip: adapter_config.json, adapter_model.safetensors, "
                                                  "manifest.json"}},
    "application/json": {"schema": {}},
    "text/html": {"schema": {"type": "string"}},
    "text/plain": {"schema": {"type": "string"}},
}

_SHA = "3f" * 32
# One example per request body model, by schema name; tests/test_openapi.py validates each against its model.
EXAMPLES: dict[str, Any] = {
    "ProjectCreate": {"name": "support-bot"},
    "RunCreate": {"project_id": "support-bot-1a2b", "kind": "trial", "provider": "aws",
                  "offer_id": "us-east-1/g6.xlarge", "price_limit_per_hour": 1.5,
                  "dataset_version_id": "ds-20250101-1a2b3c", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"},
    "RunLaunch": {"confirm": True},
    "RunCancel": {"discard": True},
    "RunRecover": {"mode": "verify_saved"},
    "Heartbeat": {"phase": "training", "progress": 0.42, "logs": ["progress=0.42 step=84 loss=1.731 lr=0.0002"]},
    "AgentComplete": {"status": "ok", "sha256": _SHA, "size": 1843201},
    "SweepRequest": {"dry_run": True},
    "ReplayRequest": {"message_id": None},
    # compute connections
    "LocalConfig": {"price_per_hour": 0.0},
    "AwsConfig": {"region": "us-east-1", "access_key_id": "AKIAIOSFODNN7EXAMPLE",
                  "secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "ami_id": "ami-0123456789abcdef0",
                  "subnet_id": "subnet-0123456789abcdef0", "security_group_id": "sg-0123456789abcdef0"},
    "AzureConfig": {
        "tenant_id": "00000000-0000-4000-8000-000000000001", "client_id": "00000000-0000-4000-8000-000000000002",
        "client_secret": "<the client secret's Value>", "subscription_id": "00000000-0000-4000-8000-000000000003",
        "resource_group": "tensorant-training", "region": "eastus",
        "subnet_id": "/subscriptions/00000000-0000-4000-8000-000000000003/resourceGroups/tensorant-training"
                     "/providers/Microsoft.Network/virtualNetworks/training/subnets/default",
        "image_id": "/subscriptions/00000000-0000-4000-8000-000000000003/resourceGroups/tensorant-training"
                    "/providers/Microsoft.Compute/images/tensorant-trainer",
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8g trainer",
    },
    "RunPodConfig": {"api_key": "<RunPod API key>", "cloud_type": "SECURE"},
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


def _provider_config(doc: _Doc) -> dict[str, Any]:
    from shared.providers import registry

    models = {name: registry.config_model(name) for name in registry.compute_names()}
    examples = {name: {"summary": f"{name} connection", "value": EXAMPLES[m.__name__]}
                for name, m in models.items() if m.__name__ in EXAMPLES}
    return {"application/json": {
        "schema": {"description": "The body for the provider named in the path: one schema per provider.",
                   "oneOf": [doc.ref(m) for m in models.values()]},
        "examples": examples}}


def _storage_config(doc: _Doc) -> dict[str, Any]:
    from typing import Annotated, Union, get_args

    from pydantic import Field

    from shared.settings import get_settings
    from shared.storage.config import StorageConfig
    from shared.storage.registry import storage_config_models

    # In production without the dev-only kinds (local storage), as the save refuses them there.
    members = storage_config_models(get_settings())
    examples = {m.__name__: {"summary": f"kind {m.model_fields['kind'].default}", "value": EXAMPLES[m.__name__]}
                for m in members if m.__name__ in EXAMPLES}
    union: Any = StorageConfig if len(members) == len(get_args(get_args(StorageConfig)[0])) else \
        Annotated[Union[tuple(members)], Field(discriminator="kind")]  # noqa: UP007 (a runtime union)
    return {"application/json": {"schema": doc.adapter(TypeAdapter(union)), "examples": examples}}


NAMED_BODIES: dict[str, Callable[[_Doc], dict[str, Any]]] = {
    "provider config": _provider_config,
    "storage config": _storage_config,
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


def _errors(mark: dict[str, Any], method: str, auth: str | None, has_params: bool) -> list[int]:
    if mark.get("errors") is not None:
        return sorted({*mark["errors"], 500})
    codes = {500}
    if auth:
        codes |= {401, 403}
        if method != "get":
            codes.add(409)
    if has_params:
        codes |= {404, 422}
    if mark.get("request"):
        codes.add(422)
    return sorted(codes)


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
    return out


def _parameters(route: str) -> list[dict[str, Any]]:
    params = []
    for name in re.findall(r"{(\w+)", route):
        schema: dict[str, Any] = {"type": "string"}
        if name == "provider":
            from shared.providers import registry

            schema["enum"] = registry.compute_names()
        params.append({"name": name, "in": "path", "required": True, "schema": schema})
    return params


def build(app: Any) -> dict[str, Any]:
    from shared.appindex import functions_of

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
        params = _parameters(route)
        for method in trigger.get("methods") or ["GET"]:
            m = str(getattr(method, "value", method)).lower()
            op: dict[str, Any] = {
                "tags": [tag],
                "operationId": fn.get_function_name(),
                "summary": mark.get("summary", ""),
                "parameters": params,
                "security": [{auth: []}] if auth else [],
                "responses": _responses(mark, _errors(mark, m, auth, bool(params)), doc, problem),
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
