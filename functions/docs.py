"""The API reference: /api/openapi.json, the /api/docs page and its vendored renderer files.

`attach(app)` registers these routes on the app it is given, and the OpenAPI document is built
from that app's registered functions, so this module needs no import of function_app.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from pathlib import Path
from typing import Any

import azure.functions as func

from shared import http
from shared.openapi import build

ANON = func.AuthLevel.ANONYMOUS
ASSETS = Path(__file__).parent / "docs_assets"
# The only files /api/docs/assets/<name> serves (no path from the request reaches the disk).
ASSET_FILES: dict[str, tuple[str, str]] = {
    "swagger-ui-bundle.js": ("swagger-ui/swagger-ui-bundle.js", "text/javascript"),
    "swagger-ui.css": ("swagger-ui/swagger-ui.css", "text/css"),
    "tensorant-docs.js": ("tensorant-docs.js", "text/javascript"),
    "LICENSE": ("swagger-ui/LICENSE", "text/plain"),
}
ASSET_CACHE = "public, max-age=3600"

STYLE = """body{margin:0}.intro{font:14px system-ui,sans-serif;max-width:1460px;margin:0 auto;padding:12px 20px 0}
.intro code{background:#f4f4f4;padding:1px 4px}"""
# Scripts from this host only (no inline script, no eval), the page's one inline style by its hash, Swagger UI's
# icons as data: images, requests ("Try it out", the document) to this API only, no framing (issue 28.17: the
# page a bearer token is pasted into). The page repeats it in a meta element (all but frame-ancestors, which
# only the header can carry), so a browser that renders the page's bytes alone enforces it too.
_CSP_PAGE = ("default-src 'none'; script-src 'self'; "
             f"style-src 'self' 'sha256-{base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()}'; "
             "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'")
CSP = _CSP_PAGE + "; frame-ancestors 'none'"
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                "X-Frame-Options": "DENY", "Cache-Control": "no-store"}

PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{_CSP_PAGE}">
<title>Tensorant control plane API</title><link rel="icon" href="data:,">
<link rel="stylesheet" href="/api/docs/assets/swagger-ui.css">
<style>{STYLE}</style></head>
<body><div class="intro"><p>Tensorant control plane API, rendered locally from
<a href="/api/openapi.json">/api/openapi.json</a>. Send <code>Authorization: Bearer &lt;token&gt;</code>
(mint one with <code>tensorant dev-token</code>); errors are <code>application/problem+json</code>
naming the field to fix.</p></div>
<div id="swagger-ui"><noscript>This page needs JavaScript; the raw document is at /api/openapi.json.</noscript></div>
<script src="/api/docs/assets/swagger-ui-bundle.js"></script>
<script src="/api/docs/assets/tensorant-docs.js"></script>
</body></html>
"""


def _public(fn: Any) -> Any:
    """Mark a documented handler as needing no token (read by shared.openapi)."""
    fn.__api__ = {**fn.__api__, "auth": None}
    return fn


@functools.cache
def _asset(name: str) -> bytes:
    return (ASSETS / ASSET_FILES[name][0]).read_bytes()


def attach(app: func.FunctionApp) -> None:
    """Register the docs routes on `app`; the OpenAPI document describes `app`'s functions."""
    bp = func.Blueprint()

    @bp.route(route="openapi.json", methods=["GET"], auth_level=ANON)
    @_public
    @http.api(summary="This API's OpenAPI document", response="application/json")
    def openapi(req: func.HttpRequest) -> func.HttpResponse:
        return http.respond(lambda ctx: build(app))

    @bp.route(route="docs", methods=["GET"], auth_level=ANON)
    @_public
    @http.api(summary="API reference page (Swagger UI, served by this app: no CDN)", response="text/html")
    def docs(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse(PAGE, mimetype="text/html", charset="utf-8", headers=PAGE_HEADERS)

    @bp.route(route="docs/assets/{name}", methods=["GET"], auth_level=ANON)
    @_public
    @http.api(summary="A file of the docs page's vendored renderer", response="docs asset")
    def docs_asset(req: func.HttpRequest) -> func.HttpResponse:
        name = req.route_params.get("name", "")
        if name not in ASSET_FILES:
            return http.problem(404, "Not found", f"no docs asset {name!r}; the page uses {', '.join(ASSET_FILES)}")
        return func.HttpResponse(_asset(name), mimetype=ASSET_FILES[name][1],
                                 headers={"Cache-Control": ASSET_CACHE, "X-Content-Type-Options": "nosniff"})

    app.register_functions(bp)
