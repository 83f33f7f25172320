"""A tiny loopback stand-in for the AWS Pricing API (moto has none).

Hand-written fake, because no emulator exists: it speaks the JSON 1.1 protocol of
AWSPriceListService.GetProducts (X-Amz-Target header, JSON body, NextToken paging)
and answers from the GetProducts pages in fixtures/get_products_pages.json, applying
the request's filters (TERM_MATCH, EQUALS, ANY_OF) to the product attributes.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "fixtures" / "get_products_pages.json"


def _matches(attrs: dict[str, str], service: str, body: dict[str, Any]) -> bool:
    if body.get("ServiceCode") != service:
        return False
    for f in body.get("Filters") or []:
        value = attrs.get(f["Field"])
        kind = f.get("Type", "TERM_MATCH")
        if kind in ("TERM_MATCH", "EQUALS") and value != f["Value"]:
            return False
        if kind == "ANY_OF" and value not in f["Value"].split(","):
            return False
        if kind == "NONE_OF" and value in f["Value"].split(","):
            return False
        if kind == "CONTAINS" and (value is None or f["Value"] not in value):
            return False
    return True


class PricingServer:
    def __init__(self, page_size: int = 4) -> None:
        pages = json.loads(FIXTURE.read_text())
        self.items: list[str] = [item for page in pages for item in page["PriceList"]]
        self.page_size = page_size  # small, so every catalog walks several pages
        self.requests: list[dict[str, Any]] = []  # {"target", "body", "authorization"}
        self.fail_with: tuple[int, str] | None = None  # (status, __type) to answer every call with
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                target = self.headers.get("X-Amz-Target", "")
                server.requests.append({"target": target, "body": body,
                                        "authorization": self.headers.get("Authorization", "")})
                if server.fail_with:
                    status, kind = server.fail_with
                    self._send(status, {"__type": kind, "message": "injected by the test"})
                elif target != "AWSPriceListService.GetProducts":
                    self._send(400, {"__type": "UnknownOperationException", "message": target})
                else:
                    self._send(200, server.get_products(body))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def get_products(self, body: dict[str, Any]) -> dict[str, Any]:
        matched = []
        for raw in self.items:
            item = json.loads(raw)
            # Filter fields name product attributes, plus the product's own productFamily.
            attrs = {**item["product"]["attributes"], "productFamily": item["product"]["productFamily"]}
            if _matches(attrs, item["serviceCode"], body):
                matched.append(raw)
        start = int(body.get("NextToken") or 0)
        size = min(int(body.get("MaxResults") or 100), self.page_size)
        out: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": matched[start:start + size]}
        if start + size < len(matched):
            out["NextToken"] = str(start + size)
        return out

    def start(self) -> PricingServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
