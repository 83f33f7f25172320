"""/api/openapi.json, generated from the registered functions and their pydantic models.

Paths and methods come from the FunctionApp itself (no second list of routes);
summaries and models come from each handler's @http.api mark.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from shared.models import Problem


def _schema(model: Any, components: dict[str, Any]) -> dict[str, Any]:
    if isinstance(model, type) and issubclass(model, BaseModel):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
        return {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"type": "object", "description": str(model)}


def _path_schema(param: str) -> dict[str, Any]:
    if param == "provider":  # the provider names come from the registry, never a second list
        from shared.providers.registry import compute_names

        return {"type": "string", "enum": compute_names()}
    return {"type": "string"}


def build(app: Any) -> dict[str, Any]:
    components: dict[str, Any] = {}
    problem = _schema(Problem, components)
    paths: dict[str, Any] = {}
    from shared.appindex import functions_of

    for fn in functions_of(app):
        trigger = fn.get_trigger().get_dict_repr()
        if trigger.get("type") != "httpTrigger":
            continue
        route = "/api/" + trigger["route"]
        mark = getattr(fn.get_user_function(), "__api__", {})
        params = [{"name": p, "in": "path", "required": True, "schema": _path_schema(p)}
                  for p in re.findall(r"{(\w+)", route)]
        for method in trigger.get("methods") or ["GET"]:
            m = str(getattr(method, "value", method)).lower()
            op: dict[str, Any] = {
                "operationId": fn.get_function_name(),
                "summary": mark.get("summary", ""),
                "parameters": params,
                "security": [{"bearer": []}],
                "responses": {
                    str(mark.get("status", 200)): {"description": "OK", "content": {
                        "application/json": {"schema": _schema(mark["response"], components)
                                             if mark.get("response") else {"type": "object"}}}},
                    "default": {"description": "Problem", "content": {"application/problem+json": {"schema": problem}}},
                },
            }
            if mark.get("request"):
                op["requestBody"] = {"content": {"application/json": {"schema": _schema(mark["request"], components)}}}
            paths.setdefault(route.replace(":int", ""), {})[m] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Tensorant control plane", "version": "1"},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}},
    }


DOCS_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Tensorant control plane API</title>
<style>body{font:14px system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em}
h2{border-bottom:1px solid #ddd}code{background:#f4f4f4;padding:1px 4px}.m{font-weight:bold;display:inline-block;width:5em}
pre{background:#f8f8f8;padding:8px;overflow:auto;font-size:12px}</style></head>
<body><h1>Tensorant control plane API</h1>
<p>Served locally from <a href="/api/openapi.json">/api/openapi.json</a>; no external scripts.
Send <code>Authorization: Bearer &lt;token&gt;</code> (mint one with <code>tensorant dev-token</code>).
Errors are <code>application/problem+json</code> naming the field to fix.</p><div id="ops">loading…</div>
<script>
fetch('/api/openapi.json').then(r=>r.json()).then(spec=>{
  const out=[];
  for(const [path,ops] of Object.entries(spec.paths)){
    for(const [m,op] of Object.entries(ops)){
      const req=op.requestBody?JSON.stringify(op.requestBody.content['application/json'].schema):'';
      out.push(`<h2><span class="m">${m.toUpperCase()}</span><code>${path}</code></h2><p>${op.summary}</p>`+
        (req?`<pre>request: ${req}</pre>`:''));
    }
  }
  const schemas=Object.entries(spec.components.schemas).map(([n,s])=>`<h2>${n}</h2><pre>${JSON.stringify(s,null,1)}</pre>`);
  document.getElementById('ops').innerHTML=out.join('')+'<h1>Schemas</h1>'+schemas.join('');
});
</script></body></html>
"""
