"""A proxy on loopback in front of moto's server that answers chosen EC2 RunInstances requests with the
error EC2 itself sends when it has no capacity or quota (moto never does): the EC2 Query API's XML error
body and HTTP status, on the wire, so the real botocore client parses it as it would EC2's. Every other
request goes to moto unchanged. Refusals are per instance type (`refuse`), each optionally for a number
of requests only (`times`)."""

from __future__ import annotations

import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

# The EC2 API reference's wording (errors-overview): capacity codes are server errors (HTTP 500), quota ones
# client errors (HTTP 400).
MESSAGES = {
    "InsufficientInstanceCapacity": (500, "We currently do not have sufficient {type} capacity in the Availability "
                                          "Zone you requested (us-east-1a). Our system will be working on "
                                          "provisioning additional capacity. You can currently get {type} capacity "
                                          "by not specifying an Availability Zone in your request or choosing "
                                          "us-east-1b, us-east-1c."),
    "InsufficientHostCapacity": (500, "There is not enough capacity on the Dedicated Host to fulfill your request."),
    "VcpuLimitExceeded": (400, "You have requested more vCPU capacity than your current vCPU limit of 0 allows for "
                               "the instance bucket that the specified instance type belongs to. Please visit "
                               "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit."),
    "InstanceLimitExceeded": (400, "You have requested more instances (1) than your current instance limit of 0 "
                                   "allows for the specified instance type."),
    "AuthFailure": (401, "AWS was not able to validate the provided access credentials"),
}


@dataclass
class Refusal:
    code: str
    times: int | None = None  # None: every request
    # The request reaches moto first (an instance is made), then EC2's error is answered: a create that said
    # no and still left something (as an instance that goes pending -> terminated), which must be released.
    after_create: bool = False


def _error_xml(code: str, message: str) -> bytes:
    """EC2's Query API error body."""
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
            f"<Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            "<RequestID>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</RequestID></Response>").encode()


class RefusingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.refuse: dict[str, Refusal] = {}  # instance type -> refusal
        self.refused: list[tuple[str, str]] = []  # (instance type, code) answered
        self.every: tuple[str, int] | None = None  # (code, HTTP status): answer every EC2 request with it
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def start(self) -> RefusingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, body: bytes, headers: dict[str, str]) -> tuple[int, bytes] | None:
        """The error for a RunInstances of a refused type, else None (forwarded)."""
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        itype = form.get("InstanceType", [""])[0]
        if self.every is not None:
            code, status = self.every
            self.refused.append((itype, code))
            return status, _error_xml(code, MESSAGES.get(code, (status, f"{code} (the contract's refusal)"))[1]
                                      .format(type=itype or "the instance"))
        if form.get("Action", [""])[0] != "RunInstances":
            return None
        refusal = self.refuse.get(itype)
        if refusal is None or refusal.times == 0:
            return None
        if refusal.times is not None:
            refusal.times -= 1
        status, text = MESSAGES[refusal.code]
        self.refused.append((itype, refusal.code))
        if refusal.after_create:
            requests.post(self.upstream + "/", data=body, timeout=60, headers=headers).raise_for_status()
        return status, _error_xml(refusal.code, text.format(type=itype))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                skip = {"host", "content-length", "connection", "accept-encoding"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                got = proxy.answer(body, headers) if self.command == "POST" else None
                if got is not None:
                    status, out = got
                    headers = {"Content-Type": "text/xml;charset=UTF-8"}
                else:
                    resp = requests.request(self.command, proxy.upstream + self.path, data=body, timeout=60,
                                            headers=headers)
                    status, out = resp.status_code, resp.content
                    headers = {k: v for k, v in resp.headers.items()
                               if k.lower() not in ("content-length", "transfer-encoding", "connection",
                                                    "content-encoding")}
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        return Handler
