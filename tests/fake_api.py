"""A fake of our own API on loopback for CLI tests (hand-written: no emulator exists for it).

It answers scripted responses per (method, path) and records every request.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tensorant_cli.main import main


class FakeApi:
    def __init__(self) -> None:
        # (method, path) -> list of (status, content_type, body); the last one repeats.
        self.routes: dict[tuple[str, str], list[tuple[int, str, Any]]] = {}
        self.requests: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                api.requests.append({"method": self.command, "path": self.path, "body": body,
                                     "headers": dict(self.headers.items())})
                answers = api.routes.get((self.command, path))
                if not answers:
                    status, ctype, payload = 404, "application/problem+json", {"title": "Not found", "status": 404}
                else:
                    status, ctype, payload = answers.pop(0) if len(answers) > 1 else answers[0]
                data = json.dumps(payload).encode() if payload is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def on(self, method: str, path: str, *answers: Any, status: int = 200,
           ctype: str = "application/json") -> None:
        self.routes[(method, path)] = [(status, ctype, a) for a in answers]

    def sent(self, method: str, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == method and r["path"].split("?")[0] == path]


def run_cli(api: FakeApi, *argv: str) -> int:
    return main(["--url", api.url, "--token", "tok-123", *argv])

