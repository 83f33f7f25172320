"""A webhook receiver on loopback built from the Standard Webhooks reference implementation (the
`standardwebhooks` package): every request is verified with `Webhook(secret).verify`, as a receiver
written by others would; the verified events and the refusals are kept for the tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook


class Receiver:
    def __init__(self) -> None:
        self.secrets: list[str] = []
        self.events: list[dict[str, Any]] = []  # verified: {"id", "body", "headers", "received"}
        self.refused: list[str] = []
        self.requests: list[dict[str, Any]] = []  # every request as received (raw)
        # status for the next requests (popped), then 204; a float: sleep that long first (a timeout)
        self.script: list[int | float] = []
        self.on_request: Callable[[dict[str, Any]], None] | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                raw = {"body": body, "headers": headers, "received": time.time()}
                receiver.requests.append(raw)
                step = receiver.script.pop(0) if receiver.script else 204
                if isinstance(step, float):
                    time.sleep(step)
                    step = 204
                if step < 300:
                    receiver.accept(raw)
                self.send_response(int(step))
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def verify(self, body: bytes, headers: dict[str, str]) -> Any:
        """The payload if any known secret verifies it; raises WebhookVerificationError otherwise."""
        error: Exception | None = None
        for s in self.secrets:
            try:
                return Webhook(s).verify(body, headers)
            except Exception as exc:
                error = exc
        raise error or RuntimeError("no secret")

    def accept(self, raw: dict[str, Any]) -> None:
        try:
            payload = self.verify(raw["body"], raw["headers"])
        except Exception as exc:
            self.refused.append(f"{type(exc).__name__}: {exc}")
            return
        self.events.append({"id": raw["headers"]["webhook-id"], "body": payload, "headers": raw["headers"],
                            "received": raw["received"]})
        if self.on_request:
            self.on_request(raw)

    def types(self) -> list[str]:
        return [e["body"]["type"] for e in self.events]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def body_of(event: dict[str, Any]) -> str:
    return json.dumps(event["body"])
