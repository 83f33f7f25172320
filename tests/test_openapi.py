"""The OpenAPI document: valid OpenAPI 3.1, true content types, one body schema per provider,
documented responses per operation, and examples that the models accept."""

from __future__ import annotations

import json
import re
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from shared import models
from shared.openapi import EXAMPLES, MORE_ERRORS, PROBLEM, QUERY, TAGS, build
from shared.org_storage.config import StorageConfig
from shared.providers import registry
from shared.services.api.runs import logs as runs


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    import function_app

    return build(function_app.app)


def _ops(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, ops in spec["paths"].items() for method, op in ops.items()]


def test_document_is_valid_openapi_3_1(spec: dict[str, Any]) -> None:
    # openapi-spec-validator comes with the dev extra moto[server].
    from openapi_spec_validator import validate

    assert spec["openapi"].startswith("3.1")
    validate(json.loads(json.dumps(spec)))  # as served: plain JSON


def test_document_is_served_and_repeatable() -> None:
    import azure.functions as func

    import function_app
    from shared.function_index import functions_of

    # Read twice: the app's own name record is not touched, so the worker can still index it.
    assert len(functions_of(function_app.app)) == len(functions_of(function_app.app))
    handler = next(fn.get_user_function() for fn in functions_of(function_app.app)
                   if fn.get_function_name() == "openapi")
    resp = handler(func.HttpRequest("GET", "http://localhost/api/openapi.json", body=b""))
    assert resp.status_code == 200 and "/api/runs/{id}" in json.loads(resp.get_body())["paths"]


def test_upload_content_types(spec: dict[str, Any]) -> None:
    upload = spec["paths"]["/api/projects/{id}/datasets"]["post"]["requestBody"]["content"]
    assert list(upload) == ["application/x-ndjson"]
    assert all(json.loads(line) for line in upload["application/x-ndjson"]["example"].splitlines())
    recover = spec["paths"]["/api/runs/{id}/recover"]["post"]["requestBody"]["content"]
    assert set(recover) == {"application/json", "application/zip"}
    assert recover["application/zip"]["schema"] == {**recover["application/zip"]["schema"], "format": "binary"}
    assert recover["application/json"]["schema"]["$ref"].endswith("/RunRecover")


def test_compute_connection_body_is_one_schema_per_provider(spec: dict[str, Any]) -> None:
    put = spec["paths"]["/api/connections/compute/{provider}"]["put"]
    body = put["requestBody"]["content"]["application/json"]
    refs = [s["$ref"].rsplit("/", 1)[1] for s in body["schema"]["oneOf"]]
    assert refs == [registry.config_model(n).__name__ for n in registry.compute_names()]
    for name in refs:
        assert spec["components"]["schemas"][name]["properties"], name
    # Each provider has an example the provider's own model accepts, and the path names the providers.
    assert set(body["examples"]) == set(registry.compute_names())
    for provider, example in body["examples"].items():
        registry.config_model(provider).model_validate(example["value"])
    assert put["parameters"][0]["schema"]["enum"] == registry.compute_names()
    storage = spec["paths"]["/api/connections/storage"]["put"]["requestBody"]["content"]["application/json"]
    assert storage["schema"]["discriminator"]["propertyName"] == "kind"
    assert len(storage["schema"]["oneOf"]) == len(get_args(get_args(StorageConfig)[0])) == len(storage["examples"])


def test_every_operation_documents_its_responses(spec: dict[str, Any]) -> None:
    problem = {"$ref": "#/components/schemas/Problem"}
    for path, method, op in _ops(spec):
        where = f"{method.upper()} {path}"
        codes = set(op["responses"])
        success = [c for c in codes if c.startswith("2")]
        assert len(success) == 1 and success[0] in {"200", "201", "202", "204"}, where
        assert ("content" in op["responses"][success[0]]) == (success[0] != "204"), where
        for code in codes - set(success):
            content = op["responses"][code]["content"][PROBLEM]
            assert content["schema"] == problem and content["example"]["status"] == int(code), where
        if op["security"]:
            assert {"401", "403"} <= codes, where
        if "{" in path:
            assert "404" in codes, where
        if "requestBody" in op:
            assert "422" in codes, where
        if op["security"] and method != "get":
            assert "409" in codes, where
        if op["security"]:
            assert "503" in codes, where  # the state store unreachable
        if "requestBody" in op:
            assert {"400", "413"} <= codes, where
        for code in {"429", "503"} & codes:
            assert "Retry-After" in op["responses"][code]["headers"], where
    ops = {op["operationId"]: op for _, _, op in _ops(spec)}
    assert ops["create_run"]["responses"]["201"]["content"]["application/json"]["schema"]["$ref"].endswith("RunView")
    assert "204" in ops["delete_compute"]["responses"]
    assert ops["openapi"]["security"] == [] and ops["docs"]["security"] == []
    assert ops["heartbeat"]["security"] == [{"agent": []}] and ops["get_run"]["security"] == [{"user": []}]


def test_the_statuses_services_answer_are_listed(spec: dict[str, Any]) -> None:
    ops = {op["operationId"]: op for _, _, op in _ops(spec)}
    assert set(MORE_ERRORS) <= set(ops) and set(QUERY) <= set(ops)

    def codes(op_id: str) -> set[str]:
        return set(ops[op_id]["responses"])

    assert {"404", "429"} <= codes("create_run")  # unknown project or dataset; run creates per minute
    for op_id in ("launch_run", "recover_run", "release_run", "check_compute", "dataset_upload_url"):
        assert "429" in codes(op_id), op_id
    assert "409" in codes("runpod_volumes") and "404" in codes("get_storage")
    # Uploads need a Content-Length (411); JSON bodies do not.
    assert "411" in codes("upload_dataset") and "411" in codes("recover_run") and "411" not in codes("create_run")
    # The agent's own report that the machine never started training.
    boot = ops["boot_failed"]
    assert boot["security"] == [{"agent": []}] and {"401", "403", "404", "422"} <= codes("boot_failed")
    assert boot["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/BootFailure")
    # The adapter: the archive itself (local storage) or a download link, 409 before the run succeeded.
    adapter = ops["run_adapter"]["responses"]
    assert adapter["200"]["content"]["application/zip"]["schema"]["format"] == "binary"
    assert adapter["200"]["content"]["application/json"]["schema"]["required"] == ["url", "expires_at", "sha256", "size"]
    assert "409" in adapter
    assert set(ops["docs_asset"]["responses"]["200"]["content"]) == {"text/javascript", "text/css", "text/plain"}
    # Query parameters the handlers read are declared, and a bad one answers 422.
    limit = next(p for p in QUERY["run_logs"] if p["name"] == "limit")["schema"]
    assert (limit["default"], limit["maximum"]) == (runs.LOG_PAGE_DEFAULT, runs.LOG_PAGE_MAX)
    for op_id, params in QUERY.items():
        declared = {p["name"] for p in ops[op_id]["parameters"] if p["in"] == "query"}
        assert declared == {p["name"] for p in params} and "422" in codes(op_id), op_id


def test_examples_are_accepted_by_their_models(spec: dict[str, Any]) -> None:
    known: dict[str, type[BaseModel]] = {
        name: obj for name, obj in vars(models).items() if isinstance(obj, type) and issubclass(obj, BaseModel)}
    known.update({registry.config_model(n).__name__: registry.config_model(n) for n in registry.compute_names()})
    known.update({m.__name__: m for m in get_args(get_args(StorageConfig)[0])})
    for name, example in EXAMPLES.items():
        assert name in known, f"EXAMPLES[{name!r}] names no request model"
        known[name].model_validate(example)
    # The run operations a user starts with show an example body.
    for op_id in ("create_run", "launch_run", "cancel_run", "create_project"):
        op = next(op for _, _, op in _ops(spec) if op["operationId"] == op_id)
        assert "example" in op["requestBody"]["content"]["application/json"], op_id


def test_operations_are_grouped_by_resource_runs_first(spec: dict[str, Any]) -> None:
    names = [t["name"] for t in spec["tags"]]
    known = [n for n, _ in TAGS if n in names]
    assert names[0] == "runs" and names[:len(known)] == known
    for path, method, op in _ops(spec):
        assert len(op["tags"]) == 1 and op["tags"][0] in names, f"{method} {path}"
        assert op["summary"], f"{method} {path} has no summary"
        declared = {p["name"] for p in op["parameters"] if p["in"] == "path"}
        assert declared == set(re.findall(r"{(\w+)}", path)), f"{method} {path}"
    assert {op["tags"][0] for p, _, op in _ops(spec) if p.startswith("/api/runs")} == {"runs"}


def test_a_body_the_builder_does_not_know_is_refused() -> None:
    from shared.openapi import _content, _Doc

    with pytest.raises(ValueError, match="not a pydantic model"):
        _content("provider confg", _Doc())


def test_docs_describe_the_app_they_are_given_without_importing_function_app() -> None:
    import subprocess
    import sys

    code = ("import sys, azure.functions as func; from functions import docs, projects; "
            "from shared.openapi import build; app = func.FunctionApp(); app.register_functions(projects.bp); "
            "docs.attach(app); paths = build(app)['paths']; "
            "assert '/api/projects' in paths and '/api/docs' in paths and '/api/runs' not in paths, paths; "
            "assert 'function_app' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
