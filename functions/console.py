"""The web console: /api/console serves its page, /api/console/<file> its scripts and style.

Plain HTML and JavaScript modules from functions/console_assets/ (no CDN, no build step). The page
calls this same API with the token the user pastes, kept in sessionStorage; this module only serves
files, so it authenticates nothing and reaches no store.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import azure.functions as func

from shared import http

ANON = func.AuthLevel.ANONYMOUS
ASSETS = Path(__file__).parent / "console_assets"
# The only files served (no path from the request reaches the disk): name -> content type.
FILES: dict[str, str] = {
    "index.html": "text/html",
    "console.css": "text/css",
    "app.js": "text/javascript",
    "api.js": "text/javascript",
    "ui.js": "text/javascript",
    "connections.js": "text/javascript",
    "forms.js": "text/javascript",
    "configure.js": "text/javascript",
    "runs.js": "text/javascript",
    "run.js": "text/javascript",
    "usage.js": "text/javascript",
    "webhooks.js": "text/javascript",
}
# Scripts and styles from this host only, no inline script, no framing; fetches go to this API only.
# (The loss curve is SVG built in the DOM, not an image; `data:` is for the favicon.)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY"}
# The page itself is never cached (a deployment changes it); its files for a few minutes.
PAGE_CACHE = "no-store"
ASSET_CACHE = "public, max-age=300"


@functools.cache
def _read(name: str) -> bytes:
    return (ASSETS / name).read_bytes()


bp = func.Blueprint()


def _public(fn: Any) -> Any:
    """Mark the handler as needing no token (read by shared.openapi): the page asks for one."""
    fn.__api__ = {**fn.__api__, "auth": None}
    return fn


def _file(name: str) -> func.HttpResponse:
    if name not in FILES:
        return http.problem(404, "Not found", f"no console file {name!r}; the console is at /api/console")
    cache = PAGE_CACHE if name == "index.html" else ASSET_CACHE
    return func.HttpResponse(_read(name), mimetype=FILES[name], charset="utf-8",
                             headers={**HEADERS, "Cache-Control": cache})


@bp.route(route="console", methods=["GET"], auth_level=ANON)
@_public
@http.api(summary="The web console's page (sign in with a pasted token)", response="text/html")
def console(req: func.HttpRequest) -> func.HttpResponse:
    return _file("index.html")


@bp.route(route="console/{name}", methods=["GET"], auth_level=ANON)
@_public
# Documented as the docs page's files are: scripts and a style sheet (shared.openapi's "docs asset").
@http.api(summary="A file of the web console (its scripts and style)", response="docs asset")
def console_file(req: func.HttpRequest) -> func.HttpResponse:
    return _file(req.route_params.get("name", ""))
