"""`--set key=value` typed by the API's own schema (GET /api/openapi.json).

A value is read as the field's type says: `--set trainer_command=false` stays the string
"false", `--set max_gpus=2` is the integer 2, `--set load_in_4bit=yes` is true. The compute
connection bodies are a oneOf per provider (schemas named `<Provider>Config`); the storage
body is a oneOf on `kind`. Dotted keys (`a.b=c`) build nested objects.
"""

from __future__ import annotations

import json
from typing import Any

TRUE = {"true", "yes", "y", "1", "on"}
FALSE = {"false", "no", "n", "0", "off"}


class SetError(ValueError):
    """A --set pair that does not fit the schema, said so the user can fix it."""


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        found = doc.get("components", {}).get("schemas", {}).get(ref.rsplit("/", 1)[-1])
        return _resolve(doc, found) if isinstance(found, dict) else {}
    return schema


def compute_schema(doc: dict[str, Any], provider: str) -> dict[str, Any] | None:
    """The connection body schema for one compute provider, or None when the doc has none."""
    op = doc.get("paths", {}).get("/api/connections/compute/{provider}", {}).get("put", {})
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    for option in body.get("oneOf", []):
        schema = _resolve(doc, option)
        if str(schema.get("title", "")).lower() == f"{provider}config".lower():
            return schema
    return None


def storage_schema(doc: dict[str, Any], kind: str | None) -> dict[str, Any] | None:
    op = doc.get("paths", {}).get("/api/connections/storage", {}).get("put", {})
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    mapping = body.get("discriminator", {}).get("mapping", {})
    if kind and kind in mapping:
        return _resolve(doc, {"$ref": mapping[kind]})
    return None


def _types(doc: dict[str, Any], schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives a field accepts (anyOf/oneOf flattened, refs resolved)."""
    schema = _resolve(doc, schema)
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return [t for o in options for t in _types(doc, o)]
    return [schema]


def coerce(doc: dict[str, Any], schema: dict[str, Any], key: str, raw: str) -> Any:
    """`raw` as the value the field's schema accepts; SetError when it cannot be."""
    options = _types(doc, schema)
    kinds = {o.get("type") for o in options}
    if "null" in kinds and raw in ("", "null", "none"):
        return None
    for option in options:
        if "enum" in option or "const" in option:
            allowed = option.get("enum") or [option.get("const")]
            if raw in allowed:
                return raw
            if kinds <= {"string", "null"} and len(options) == 1 + ("null" in kinds):
                raise SetError(f"{key} must be one of {', '.join(map(str, allowed))}, not {raw!r}")
    if "string" in kinds:
        return raw
    if "boolean" in kinds:
        if raw.lower() in TRUE:
            return True
        if raw.lower() in FALSE:
            return False
    if "integer" in kinds:
        try:
            return int(raw)
        except ValueError:
            pass
    if "number" in kinds:
        try:
            return float(raw)
        except ValueError:
            pass
    if kinds & {"array", "object"}:
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise SetError(f"{key} takes JSON ({'/'.join(sorted(k for k in kinds if k))}): {exc}") from exc
    wanted = " or ".join(sorted(str(k) for k in kinds if k)) or "a value"
    raise SetError(f"{key} takes {wanted}, not {raw!r}")


def apply_set(body: dict[str, Any], pairs: list[str], doc: dict[str, Any] | None,
              schema: dict[str, Any] | None) -> dict[str, Any]:
    """Apply key=value pairs to `body`, typed by `schema` (JSON-guessed when there is no schema)."""
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SetError(f"--set needs key=value, got {pair!r}")
        *parents, leaf = key.split(".")
        target, field_schema = body, schema
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise SetError(f"{key}: {part} is not an object")
            field_schema = _field(doc or {}, field_schema, part, key)
        leaf_schema = _field(doc or {}, field_schema, leaf, key)
        if leaf_schema is None:
            try:
                target[leaf] = json.loads(raw)
            except ValueError:
                target[leaf] = raw
        else:
            target[leaf] = coerce(doc or {}, leaf_schema, key, raw)
    return body


def _field(doc: dict[str, Any], schema: dict[str, Any] | None, name: str, key: str) -> dict[str, Any] | None:
    if schema is None:
        return None
    for option in _types(doc, schema):
        props = option.get("properties")
        if isinstance(props, dict):
            if name in props:
                return dict(props[name])
            if option.get("additionalProperties") is False:
                raise SetError(f"{key}: no field {name!r}; the fields are {', '.join(sorted(props))}")
    return None


def provider_names(doc: dict[str, Any]) -> list[str]:
    """The compute providers a control plane offers: the `provider` path parameter's enum of
    PUT /api/connections/compute/{provider}, which the API builds from its provider registry (so
    it follows the deployment: a production one leaves out the dev-only `local`). Empty for a
    document without one."""
    op = doc.get("paths", {}).get("/api/connections/compute/{provider}", {}).get("put", {})
    for param in op.get("parameters", []):
        if param.get("in") == "path" and param.get("name") == "provider":
            return [str(name) for name in param.get("schema", {}).get("enum", [])]
    return []
