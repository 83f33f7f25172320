"""The instance metadata service as EC2 serves it, IMDSv2 only (an instance launched with HttpTokens=required):
`PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` (1-21600) answers a session token;
every GET needs it in `X-aws-ec2-metadata-token` (401 without). Serves the instance's meta-data tree
(instance-id, hostname, placement, ...), `user-data` (404 when the instance has none) and the instance
identity document, under `latest` and the dated versions cloud-init asks for. Standard library only.

The VM reaches it at 169.254.169.254:80 (tools/vm/vm.py: the guest's eth0 is a user-mode network of its
own, 169.254.0.0/16, whose guestfwd runs tools/vm/relay.py to this server's loopback port), so
cloud-init's own Ec2 datasource reads the user data the way it does on EC2. `requests` records what was
asked, token or not.
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_PATH = "/latest/api/token"
VERSIONS = ("latest", "2009-04-04", "2016-09-02", "2018-09-24", "2021-03-23")


class Imds:
    def __init__(self, user_data: str, *, instance_id: str = "i-0vmcheck0000000", region: str = "us-east-1",
                 instance_type: str = "g6.xlarge") -> None:
        self.user_data = user_data.encode()
        self.tokens: set[str] = set()
        self.requests: list[dict[str, Any]] = []
        zone = f"{region}a"
        self.meta: dict[str, Any] = {
            "ami-id": "ami-0123456789abcdef0", "instance-id": instance_id, "instance-type": instance_type,
            "hostname": "ip-169-254-0-15.ec2.internal", "local-hostname": "ip-169-254-0-15.ec2.internal",
            "local-ipv4": "169.254.0.15", "placement": {"availability-zone": zone, "region": region},
        }
        self.identity = {"instanceId": instance_id, "region": region, "availabilityZone": zone,
                         "instanceType": instance_type, "imageId": self.meta["ami-id"], "architecture": "x86_64"}
        imds = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_PUT(self) -> None:
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                imds.requests.append({"method": "PUT", "path": self.path, "ttl": ttl})
                if self.path != TOKEN_PATH:
                    return self._answer(404, b"")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._answer(400, b"")
                token = secrets.token_urlsafe(32)
                imds.tokens.add(token)
                return self._answer(200, token.encode())

            def do_GET(self) -> None:
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                imds.requests.append({"method": "GET", "path": self.path, "token": token in imds.tokens})
                if token not in imds.tokens:
                    return self._answer(401, b"")  # IMDSv2 required: no token, no answer
                found = imds.get(self.path)
                return self._answer(404, b"") if found is None else self._answer(200, found)

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def get(self, path: str) -> bytes | None:
        """What EC2 answers at `path` (a listing for a folder: its names, folders with a trailing slash)."""
        version, _, rest = path.lstrip("/").partition("/")
        if version not in VERSIONS:
            return None
        if rest == "":
            return b"dynamic\nmeta-data\nuser-data\n" if self.user_data else b"dynamic\nmeta-data\n"
        if rest == "user-data":
            return self.user_data or None
        if rest.rstrip("/") == "dynamic":
            return b"instance-identity/"
        if rest.rstrip("/") == "dynamic/instance-identity":
            return b"document"  # cloud-init reads the folder, then each name in it
        if rest.rstrip("/") == "dynamic/instance-identity/document":
            return json.dumps(self.identity).encode()
        if not (rest == "meta-data" or rest.startswith("meta-data/")):
            return None
        node: Any = self.meta
        for part in [p for p in rest.split("/")[1:] if p]:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        if isinstance(node, dict):
            return "\n".join(f"{k}/" if isinstance(v, dict) else k for k, v in node.items()).encode()
        return str(node).encode()

    def user_data_reads(self) -> list[bool]:
        """For each read of the user data: whether it came with a valid token."""
        return [r["token"] for r in self.requests if r["method"] == "GET" and r["path"].endswith("/user-data")]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
