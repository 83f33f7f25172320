"""The /api/docs page, where a bearer token is pasted (issue 28.17): it answers with a Content-Security-Policy
(scripts from this host only, no inline script, no framing) and its script keeps the token in sessionStorage,
never in localStorage (Swagger UI's persistAuthorization). The page still renders under that policy in
Chromium: tests/test_docs_page.py (the page carries the policy in a meta element too)."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

import azure.functions as func

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "functions" / "docs_assets" / "tensorant-docs.js"


def _handler(name: str) -> Any:
    import function_app
    from shared.function_index import functions_of

    return next(fn.get_user_function() for fn in functions_of(function_app.app) if fn.get_function_name() == name)


def _directives(csp: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in csp.split(";")) if d}


def test_the_docs_page_sends_a_content_security_policy() -> None:
    req = func.HttpRequest(method="GET", url="http://localhost/api/docs", body=b"")
    resp = _handler("docs")(req)
    assert resp.status_code == 200
    csp = resp.headers.get("Content-Security-Policy")
    assert csp, dict(resp.headers)
    policy = _directives(csp)
    assert policy["default-src"] == ["'none'"] and policy["script-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"] and policy["connect-src"] == ["'self'"]
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
    assert resp.headers.get("X-Content-Type-Options") == "nosniff"

    page = resp.get_body().decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page), "an inline script would need 'unsafe-inline'"
    # The one inline style is allowed by its hash, which must be the style's.
    [style] = re.findall(r"<style>(.*?)</style>", page, re.S)
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in policy["style-src"]
    [meta] = re.findall(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page)
    assert _directives(meta) == {k: v for k, v in policy.items() if k != "frame-ancestors"}


def test_the_docs_script_keeps_the_token_in_session_storage() -> None:
    js = SCRIPT.read_text()
    code = "\n".join(line for line in js.splitlines() if not line.lstrip().startswith("//"))
    assert "localStorage" not in code
    assert "sessionStorage.setItem" in code and "sessionStorage.getItem" in code
    # Swagger UI's own persistence writes localStorage["authorized"]: it must stay off.
    assert re.search(r"persistAuthorization:\s*false", code)
