"""/api/docs: the vendored Swagger UI, served by the function app itself, renders every
operation in headless Chromium with the network off (only 127.0.0.1 is reachable)."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest

CHROMIUM = "/usr/bin/chromium"


class _AppServer:
    """Serves the function app's GET routes on 127.0.0.1, through the registered handlers."""

    def __init__(self) -> None:
        import function_app
        from shared.function_index import functions_of

        self.routes: list[tuple[re.Pattern[str], Any]] = []
        for fn in functions_of(function_app.app):
            trigger = fn.get_trigger().get_dict_repr()
            if trigger["type"] == "httpTrigger" and "GET" in [str(getattr(m, "value", m)) for m in trigger["methods"]]:
                pattern = re.sub(r"{(\w+)(:\w+)?}", r"(?P<\1>[^/]+)", trigger["route"])
                self.routes.append((re.compile(f"^{pattern}$"), fn.get_user_function()))
        self.requests: list[tuple[str, int]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body, content_type = server.handle(self.path)
                server.requests.append((self.path, status))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def handle(self, path: str) -> tuple[int, bytes, str]:
        route = path.split("?")[0].removeprefix("/api/")
        for rx, user in self.routes:
            match = rx.match(route)
            if match and path.startswith("/api/"):
                resp = user(func.HttpRequest("GET", self.base + path, body=b"", route_params=match.groupdict()))
                return resp.status_code, resp.get_body(), resp.mimetype or "application/octet-stream"
        return 404, b"not found", "text/plain"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[_AppServer]:
    srv = _AppServer()
    yield srv
    srv.close()


def _get(server: _AppServer, path: str) -> tuple[int, bytes, str]:
    import requests

    resp = requests.get(server.base + path, timeout=10)
    return resp.status_code, resp.content, resp.headers["Content-Type"]


def test_page_and_assets_are_served_locally(server: _AppServer) -> None:
    status, page, content_type = _get(server, "/api/docs")
    assert status == 200 and content_type.startswith("text/html")
    refs = [r for r in re.findall(rb'(?:src|href)="([^"]+)"', page) if r != b"data:,"]  # data:, = no favicon
    assert refs and all(r.startswith(b"/api/") for r in refs), refs  # no CDN, nothing off this host
    for ref in refs:
        status, body, _ = _get(server, ref.decode())
        assert status == 200 and body, ref
    status, js, content_type = _get(server, "/api/docs/assets/swagger-ui-bundle.js")
    assert content_type.startswith("text/javascript") and b"SwaggerUIBundle" in js
    status, license_text, _ = _get(server, "/api/docs/assets/LICENSE")
    assert status == 200 and b"Apache License" in license_text
    # Only the listed files: no path from the request reaches the disk.
    assert _get(server, "/api/docs/assets/..%2Fdocs.py")[0] == 404
    assert _get(server, "/api/docs/assets/README.md")[0] == 404


def _render(url: str, tmp_path: Path) -> str:
    if not Path(CHROMIUM).exists() or not shutil.which(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install the Debian package `chromium` to render /api/docs "
                    "(CI installs it in .ci/run)")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", "--no-default-browser-check", f"--user-data-dir={tmp_path / 'profile'}",
           # Network off: every host but 127.0.0.1 goes to a closed proxy and resolves to nothing.
           "--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
           "--virtual-time-budget=15000", "--dump-dom", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_docs_page_renders_every_operation_in_chromium(server: _AppServer, tmp_path: Path) -> None:
    import function_app
    from shared.openapi import build

    spec = build(function_app.app)
    server.requests.clear()
    dom = _render(server.base + "/api/docs", tmp_path)
    assert 'id="swagger-ui"' in dom and "swagger-ui" in dom
    served = dict(server.requests)
    assert served.get("/api/openapi.json") == 200, server.requests
    assert all(status == 200 for _, status in server.requests), server.requests
    # Every operation's summary renders (HTML-escaped as the browser writes it).
    summaries = {op["summary"] for ops in spec["paths"].values() for op in ops.values()}
    missing = [s for s in summaries if _html(s) not in dom]
    assert not missing, f"not rendered: {missing}"
    # Grouped by resource, in the document's tag order: runs first.
    tag_order = re.findall(r'data-tag="([^"]+)"', dom)
    assert tag_order and tag_order[0] == "runs", tag_order
    assert list(dict.fromkeys(tag_order)) == [t["name"] for t in spec["tags"]]
    # Bodies render from the schemas: the provider oneOf and the upload media types.
    assert "application/x-ndjson" in dom or "Save a compute connection" in dom


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
