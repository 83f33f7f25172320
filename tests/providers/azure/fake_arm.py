"""A fake Azure Resource Manager (plus token endpoint and Retail Prices API) on loopback HTTPS.

Hand-written because no ARM emulator exists. It speaks the wire protocol the real
azure-mgmt-compute / azure-mgmt-network / azure-identity clients use: bearer tokens from
an OpenID client-credentials endpoint, JSON resources, `nextLink` paging, long-running
operations with Azure-AsyncOperation + Location headers (InProgress for `op_polls` polls, or
for `op_seconds` on the core's clock, shared.clock: the tests' simulated time, or held until
released), ARM error bodies, 429 with Retry-After. It models what the
adapter depends on: VM create makes the implicit OS disk (untagged, as Azure does),
allocation failures leave the VM resource behind in a Failed state, deleteOption is
honoured, a NIC in use or a disk attached cannot be deleted. Every request is recorded
so tests can map it to the RBAC action it needs. Managed boot diagnostics: a VM created with
diagnosticsProfile.bootDiagnostics.enabled answers POST .../retrieveBootDiagnosticsData with
SAS URIs that this server serves itself (GET and HEAD, byte ranges, no bearer token, the SAS
signature checked), with the VM's console text (`set_console`, else a short boot log).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import ipaddress
import json
import re
import secrets
import socket
import ssl
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from shared.clock import now_ts

SUB = "11111111-2222-3333-4444-555555555555"
TENANT = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
CLIENT = "99999999-8888-7777-6666-555555555555"
SECRET = "abc8Q~fake-secret-value-0123456789abcdefgh"


def make_cert(directory: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (generated at test time), usable as its own CA bundle."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "arm-cert.pem", directory / "arm-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


@dataclass
class Fault:
    method: str
    pattern: str  # regex searched in the lower-case path
    status: int
    code: str
    message: str = "injected"
    times: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None  # the whole answer's body (default: {"error": {code, message}})


@dataclass
class Op:
    effect: Any  # callable applied when the operation completes
    remaining: int
    error: dict[str, str] | None = None
    status: str = "InProgress"
    due_at: float | None = None  # set: completes at this shared.clock time (polled or not), not by polls

    def due(self) -> bool:
        return self.due_at is None or now_ts() >= self.due_at


class ArmError(Exception):
    def __init__(self, status: int, code: str, message: str = "", *, target: str = "",
                 details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.target = status, code, message or code, target
        self.details = details or []

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.target:
            error["target"] = self.target
        if self.details:
            error["details"] = self.details
        return {"error": error}


# What Azure answers a VM create it cannot serve (issue 37), per kind, as its documents and error bodies spell
# it: allocation failures fail the create's long-running operation and leave the VM resource Failed (its OS
# disk and the NIC made before it stay); SkuNotAvailable and a quota's OperationNotAllowed refuse the PUT.
ALLOCATION_CODES = ("AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest")
ALLOCATION_MESSAGE = ("Allocation failed. We do not have sufficient capacity for the requested VM size in this "
                      "region. Read more about improving likelihood of allocation success at "
                      "http://aka.ms/allocation-guidance")


def refusal_error(code: str, size: str, region: str) -> ArmError:
    if code == "SkuNotAvailable":
        return ArmError(409, code, (
            f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: {size}' is "
            f"currently not available in location '{region}'. Please try another size or deploy to a different "
            "location or different zones. See https://aka.ms/azureskunotavailable for details."))
    if code == "QuotaExceeded":  # Compute's own answer: OperationNotAllowed, the quota in its words and details
        family = "standard" + size.removeprefix("Standard_").split("_")[0].rstrip("0123456789") + "Family"
        message = (f"Operation could not be completed as it results in exceeding approved {family} Cores quota. "
                   f"Additional details - Deployment Model: Resource Manager, Location: {region}, Current Limit: 0, "
                   "Current Usage: 0, Additional Required: 24, (Minimum) New Limit Required: 24. Submit a request "
                   "for Quota increase at https://aka.ms/ProdportalCRP/#blade/Microsoft_Azure_Capacity/"
                   "UsageAndQuota.ReactView by specifying parameters listed in the 'Details' section for "
                   "deployment to succeed.")
        return ArmError(409, "OperationNotAllowed", message, details=[
            {"code": "QuotaExceeded", "target": family, "message": message}])
    raise ValueError(code)


# ------------------------------------------------------------------ a tiny OData $filter evaluator


def _odata_match(expr: str, item: dict[str, Any]) -> bool:
    tokens = re.findall(r"'(?:[^']|'')*'|\(|\)|,|[A-Za-z_][A-Za-z0-9_]*", expr)
    pos = 0

    def peek() -> str:
        return tokens[pos] if pos < len(tokens) else ""

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def factor() -> bool:
        tok = take()
        if tok == "(":
            value = disjunction()
            take()  # ')'
            return value
        if tok == "contains":
            take()
            fld = take()
            take()
            lit = take()[1:-1].replace("''", "'")
            take()
            return lit in str(item.get(fld, ""))
        op = take()
        lit = take()[1:-1].replace("''", "'")
        assert op == "eq", op
        return str(item.get(tok, "")) == lit

    def conjunction() -> bool:
        value = factor()
        while peek() == "and":
            take()
            value = factor() and value
        return value

    def disjunction() -> bool:
        value = conjunction()
        while peek() == "or":
            take()
            value = conjunction() or value
        return value

    return disjunction()


# ------------------------------------------------------------------ the fake


class FakeArm:
    def __init__(self, tmp: Path, *, region: str = "eastus") -> None:
        self.region = region
        self.cert, self._key = make_cert(tmp)
        self.resources: dict[str, dict[str, Any]] = {}
        self.ops: dict[str, Op] = {}
        self.requests: list[tuple[str, str, str, Any]] = []  # method, path, query, body
        self.faults: list[Fault] = []
        self.op_polls = 1
        self.op_seconds = 0.0  # > 0: a new operation takes this long on the core's (simulated) clock
        self.disk_update_s = 0.0  # > 0: a disk PATCH (202, long-running as in Azure) takes this long instead
        self.hold_ops = False
        self.allocation_failure: str | None = None
        # Per VM size: a code of ALLOCATION_CODES (the create's operation fails), "SkuNotAvailable" or
        # "QuotaExceeded" (the PUT is refused), as refusal_error and _put_vm answer it.
        self.refuse_sizes: dict[str, str] = {}
        self.keep_nic_on_vm_delete = False
        # As Azure: a NIC its VM left stays reserved for that VM this long (on the core's clock), and a
        # delete meanwhile is 400 NicReservedForAnotherVm.
        self.nic_reserved_s = 180.0
        self.page_size = 2
        self.client_secret = SECRET
        self.tokens: set[str] = set()
        self.skus: list[dict[str, Any]] = []
        self.usages: list[dict[str, Any]] = []
        self.price_items: list[dict[str, Any]] = []
        self.price_page_size = 3
        self.price_queries: list[str] = []
        self.sas: dict[str, str] = {}  # SAS signature -> the VM id whose serial log it reads
        # The principal's roles are assignable only in SUB (infra/azure's AssignableScopes), so in any other
        # subscription it may only read, and only under these scopes (a role such as Reader assigned there by
        # that subscription's owner); anything else there is 403 AuthorizationFailed, as ARM answers it.
        self.foreign_read_scopes: list[str] = []
        self.blob_reads: list[tuple[str, str]] = []  # (method, Range header) of every serial log read
        self.lock = threading.RLock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self._key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def start(self) -> FakeArm:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.hold_ops = False
        self.server.shutdown()
        self.server.server_close()

    # ---------------------------------------------------------- test helpers

    def rid(self, rg: str, provider_type: str, name: str, sub: str = SUB) -> str:
        return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/{provider_type}/{name}"

    def put(self, rid: str, body: dict[str, Any]) -> dict[str, Any]:
        body = {"id": rid, "name": rid.rsplit("/", 1)[-1], **body}
        with self.lock:
            self.resources[rid.lower()] = body
        return body

    def get(self, rid: str) -> dict[str, Any] | None:
        return self.resources.get(rid.lower())

    def fail(self, method: str, pattern: str, status: int, code: str, *, times: int = 1, message: str = "injected",
             headers: dict[str, str] | None = None) -> None:
        self.faults.append(Fault(method, pattern, status, code, message, times, headers or {}))

    def throttle(self, method: str, pattern: str, *, by: str = "arm", retry_after: int = 5, times: int = 1,
                 policy: str = "PutVM3Min") -> None:
        """Answer the next `times` matching requests 429 as Azure throttles them (learn.microsoft.com:
        "Troubleshooting API throttling errors" and "Throttling Resource Manager requests"): Retry-After in
        seconds and the remaining-calls header of whoever throttled, with its error body.
        by="arm": Resource Manager's subscription limit (SubscriptionRequestsThrottled,
        x-ms-ratelimit-remaining-subscription-reads/-writes/-deletes: 0).
        by="compute": the Compute resource provider's policy `policy` (code OperationNotAllowed, the reason in
        details: TooManyRequests with the policy as its target; x-ms-ratelimit-remaining-resource: 0)."""
        headers = {"Retry-After": str(retry_after)}
        body: dict[str, Any]
        if by == "arm":
            kind = {"GET": "read", "DELETE": "delete"}.get(method, "write")
            headers[f"x-ms-ratelimit-remaining-subscription-{kind}s"] = "0"
            body = {"error": {"code": "SubscriptionRequestsThrottled", "message": (
                f"Number of '{kind}' requests for subscription '{SUB}' actor '{CLIENT}' exceeded. Please try again "
                f"after '{retry_after}' seconds after additional tips: https://aka.ms/ARMThrottling")}}
        elif by == "compute":
            headers["x-ms-ratelimit-remaining-resource"] = f"Microsoft.Compute/{policy};0"
            start = dt.datetime.fromtimestamp(now_ts(), dt.UTC)
            group = {"operationGroup": policy, "startTime": start.isoformat(),
                     "endTime": (start + dt.timedelta(seconds=retry_after)).isoformat(),
                     "allowedRequestCount": 240, "measuredRequestCount": 241}
            body = {"error": {"code": "OperationNotAllowed", "message": "The server rejected the request because too "
                              "many requests have been received for this subscription.",
                              "details": [{"code": "TooManyRequests", "target": policy, "message": json.dumps(group)}]}}
        else:
            raise ValueError(by)
        self.faults.append(Fault(method, pattern, 429, str(body["error"]["code"]), times=times, headers=headers,
                                 body=body))

    def latest_op_due(self) -> bool:
        """Whether the newest operation can complete at its next poll (the one a caller waits on)."""
        with self.lock:
            op = next(reversed(self.ops.values()), None)
            return op is not None and not self.hold_ops and op.due()

    def _settle(self) -> None:
        """Timed operations complete when their time comes, whether or not anyone polls them (as in
        Azure: a delete goes on after the caller stopped waiting)."""
        if self.hold_ops:
            return
        for op in self.ops.values():
            if op.status == "InProgress" and op.due_at is not None and op.due():
                self._complete(op)

    def _complete(self, op: Op) -> None:
        op.effect()
        op.status = "Failed" if op.error else "Succeeded"

    def finish_ops(self) -> None:
        """Stop holding long-running operations and let every one of them complete now."""
        self.hold_ops = False
        for op_id in list(self.ops):
            self._poll(op_id)

    def set_console(self, vm_id: str, text: str) -> None:
        """What the VM's serial console log holds (the boot diagnostics blob)."""
        vm = self.get(vm_id)
        assert vm is not None, vm_id
        vm["_console"] = text

    def of_type(self, provider_type: str) -> list[dict[str, Any]]:
        marker = f"/providers/{provider_type.lower()}/"
        return [r for k, r in self.resources.items() if marker in k and k.count("/") == 8]

    # ---------------------------------------------------------- dispatch

    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> tuple[int, dict[str, str], Any]:
        parts = urlsplit(raw_path)
        path, query = parts.path, parse_qs(parts.query)
        data: Any = None
        if body:
            try:
                data = json.loads(body)
            except ValueError:
                data = body.decode()
        with self.lock:
            self.requests.append((method, path, parts.query, data))
            self._settle()
            try:
                if path.endswith("/.well-known/openid-configuration"):
                    return self._openid(path)
                if path.endswith("/oauth2/v2.0/token"):
                    return self._token(data if isinstance(data, str) else body.decode())
                if path.startswith("/api/retail/prices"):
                    return self._prices(query)
                if path.startswith("/bootdiag/"):
                    return self._serial_log(method, query, headers)
                auth = headers.get("Authorization", "")
                if not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
                    raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.")
                self._authorize(method, path)
                for fault in self.faults:
                    if fault.method == method and fault.times > 0 and re.search(fault.pattern, path.lower()):
                        fault.times -= 1
                        return fault.status, fault.headers, fault.body or {"error": {"code": fault.code,
                                                                                     "message": fault.message}}
                return self._arm(method, path, query, data)
            except ArmError as e:
                return e.status, {}, e.body()
            except Exception as e:  # a fake bug must show as a 500, not a dropped connection
                return 500, {}, {"error": {"code": "FakeBug", "message": repr(e)}}

    def _readable(self, resource_id: str) -> bool:
        """Whether the principal may read resource_id: anything in SUB, elsewhere only under a granted scope."""
        low = resource_id.lower()
        if low.startswith(f"/subscriptions/{SUB}/") or low == f"/subscriptions/{SUB}":
            return True
        return any(low == s.lower().rstrip("/") or low.startswith(s.lower().rstrip("/") + "/")
                   for s in self.foreign_read_scopes)

    def _authorize(self, method: str, path: str) -> None:
        """ARM's role check for a request outside SUB (see foreign_read_scopes), with Azure's error body."""
        low = path.lower()
        if not low.startswith("/subscriptions/") or low.startswith(f"/subscriptions/{SUB}/"):
            return  # a tenant-level path, or the connection's own subscription (its roles decide: test_roles.py)
        if method == "GET" and self._readable(path):
            return
        raise ArmError(403, "AuthorizationFailed", (
            f"The client '{CLIENT}' with object id '{CLIENT}' does not have authorization to perform action "
            f"'{rbac_action(method, path)}' over scope '{path}' or the scope is invalid. If access was recently "
            "granted, please refresh your credentials."))

    def _openid(self, path: str) -> tuple[int, dict[str, str], Any]:
        tenant = path.strip("/").split("/")[0]
        base = f"{self.url}/{tenant}"
        return 200, {}, {
            "token_endpoint": f"{base}/oauth2/v2.0/token",
            "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
            "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
            "issuer": f"{base}/v2.0",
            "token_endpoint_auth_methods_supported": ["client_secret_post"],
            "response_types_supported": ["code", "token"],
            "tenant_region_scope": "NA",
        }

    def _token(self, form_text: str) -> tuple[int, dict[str, str], Any]:
        form = {k: v[0] for k, v in parse_qs(form_text).items()}
        if form.get("client_id") != CLIENT or form.get("client_secret") != self.client_secret:
            return 401, {}, {"error": "invalid_client", "error_codes": [7000215],
                             "error_description": "AADSTS7000215: Invalid client secret provided."}
        token = uuid.uuid4().hex
        self.tokens.add(token)
        return 200, {}, {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}

    def _prices(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], Any]:
        flt = query.get("$filter", [""])[0]
        self.price_queries.append(flt)
        # meterRegion='primary' leaves out the meters of secondary regions (isPrimaryMeterRegion false), as
        # the real API does; without it both come back.
        primary = query.get("meterRegion", [""])[0] == "'primary'"
        items = [it for it in self.price_items if _odata_match(flt, it)
                 and (not primary or it.get("isPrimaryMeterRegion", True))]
        skip = int(query.get("$skip", ["0"])[0])
        page = items[skip:skip + self.price_page_size]
        nxt = None
        if skip + self.price_page_size < len(items):
            params = {"currencyCode": query.get("currencyCode", ["USD"])[0], "$filter": flt,
                      "$skip": str(skip + self.price_page_size),
                      **({"meterRegion": "'primary'"} if primary else {})}
            nxt = f"{self.url}/api/retail/prices?{urlencode(params)}"
        return 200, {}, {"BillingCurrency": "USD", "Items": page, "NextPageLink": nxt, "Count": len(page)}

    # ---------------------------------------------------------- ARM

    def _lro(self, effect: Any, provider: str, *, error: dict[str, str] | None = None,
             location: bool = False, seconds: float | None = None) -> dict[str, str]:
        op_id = uuid.uuid4().hex
        seconds = self.op_seconds if seconds is None else seconds
        self.ops[op_id] = Op(effect=effect, remaining=self.op_polls, error=error,
                             due_at=now_ts() + seconds if seconds > 0 else None)
        base = f"{self.url}/subscriptions/{SUB}/providers/{provider}/locations/{self.region}"
        headers = {"Azure-AsyncOperation": f"{base}/operations/{op_id}?api-version=2024-01-01", "Retry-After": "0"}
        if location:
            headers["Location"] = f"{base}/operationResults/{op_id}?api-version=2024-01-01"
        return headers

    def _poll(self, op_id: str) -> Op:
        op = self.ops.get(op_id)
        if op is None:
            raise ArmError(404, "NotFound", "no such operation")
        if op.status == "InProgress" and not self.hold_ops:
            op.remaining -= 1
            if op.due() if op.due_at is not None else op.remaining <= 0:
                self._complete(op)
        return op

    def _list(self, prefix: str, query: dict[str, list[str]], path: str,
              items: list[dict[str, Any]] | None = None) -> tuple[int, dict[str, str], Any]:
        if items is None:
            low = prefix.lower() + "/"
            items = [r for k, r in sorted(self.resources.items()) if k.startswith(low) and "/" not in k[len(low):]]
        start = int(query.get("$skiptoken", ["0"])[0])
        page = items[start:start + self.page_size]
        out: dict[str, Any] = {"value": page}
        if start + self.page_size < len(items):
            out["nextLink"] = f"{self.url}{path}?api-version=2024-01-01&$skiptoken={start + self.page_size}"
        return 200, {}, out

    def _arm(self, method: str, path: str, query: dict[str, list[str]], data: Any) -> tuple[int, dict[str, str], Any]:
        low = path.lower()
        m = re.match(r"^/subscriptions/[^/]+/providers/microsoft\.(compute|network)/locations/[^/]+/"
                     r"(operations|operationresults)/([0-9a-f]+)$", low)
        if m:
            op = self._poll(m.group(3))
            # Held or not due yet: a poller comes back in a (real) second rather than spinning.
            retry = {"Retry-After": "1" if op.status == "InProgress" and (self.hold_ops or not op.due()) else "0"}
            if m.group(2) == "operationresults":
                if op.status == "InProgress":
                    return 202, {**retry, "Location": self.url + path}, None
                return 200, {}, None
            body: dict[str, Any] = {"status": op.status, "name": m.group(3)}
            if op.status == "Failed":
                body["error"] = op.error
            return 200, retry, body
        if re.match(r"^/subscriptions/[^/]+/providers/microsoft\.compute/skus$", low):
            loc = re.search(r"location eq '([^']+)'", query.get("$filter", [""])[0])
            items = [s for s in self.skus if not loc or loc.group(1) in [x.lower() for x in s.get("locations", [])]]
            return self._list("", query, path, items)
        if re.match(r"^/subscriptions/[^/]+/providers/microsoft\.compute/locations/[^/]+/usages$", low):
            return self._list("", query, path, self.usages)
        m = re.match(r"^(/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.(?:compute|network)/"
                     r"(?:virtualmachines|disks|networkinterfaces))$", low)
        if m and method == "GET":
            return self._list(m.group(1), query, path)
        m = re.match(r"^/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.devtestlab/schedules(/[^/]+)?$",
                     low)
        if m:
            return self._schedule(method, path, bool(m.group(1)), data)
        m = re.match(r"^(.*/providers/microsoft\.compute/virtualmachines/[^/]+)/"
                     r"(deallocate|start|poweroff|instanceview|retrievebootdiagnosticsdata)$", low)
        if m:
            return self._vm_action(m.group(1), m.group(2), method)
        rid = path
        kind = _kind(low)
        if method == "GET":
            res = self.get(rid)
            if res is None:
                raise ArmError(404, "ResourceNotFound", f"The Resource '{rid}' was not found.")
            if kind == "vm" and "instanceview" in query.get("$expand", [""])[0].lower():
                return 200, {}, {**res, "properties": {**res["properties"], "instanceView": self._iv(res)}}
            return 200, {}, res
        if method == "PUT" and kind == "vm":
            return self._put_vm(path, data)
        if method == "PUT" and kind == "nic":
            return self._put_nic(path, data)
        if method == "PATCH" and kind == "disk":
            return self._patch_disk(rid, data)
        if method == "DELETE":
            return self._delete(rid, kind)
        raise ArmError(400, "UnsupportedByFake", f"{method} {path}")

    def _schedule(self, method: str, path: str, one: bool, data: Any) -> tuple[int, dict[str, str], Any]:
        """A VM's auto-shutdown schedule (Microsoft.DevTestLab/schedules, GlobalSchedules_*): the request body
        checked against the vendored request schema (arm_request_schemas.json) and ARM's rules for the
        ComputeVmShutdownTask (its name, its target VM, a daily HHmm time in a time zone)."""
        if not one:
            if method != "GET":
                raise ArmError(400, "UnsupportedByFake", f"{method} {path}")
            prefix = path.lower() + "/"
            return 200, {}, {"value": [r for k, r in self.resources.items() if k.startswith(prefix)]}
        if method == "GET":
            got = self.get(path)
            if got is None:
                raise ArmError(404, "ResourceNotFound", f"The Resource '{path}' was not found.")
            return 200, {}, got
        if method == "DELETE":
            return (200, {}, None) if self.resources.pop(path.lower(), None) is not None else (204, {}, None)
        if method != "PUT":
            raise ArmError(400, "UnsupportedByFake", f"{method} {path}")
        from tests.providers.azure.test_request_schemas import problems  # the same check the schema test runs

        found = problems(data, {"$ref": "Schedule"})
        if found:
            raise ArmError(400, "InvalidRequestContent", "; ".join(found))
        props = data["properties"]
        name = path.rsplit("/", 1)[-1]
        target = str(props.get("targetResourceId", ""))
        if props.get("taskType") != "ComputeVmShutdownTask" or not name.startswith("shutdown-computevm-"):
            raise ArmError(400, "InvalidScheduleName", "A virtual machine's schedule is named "
                           "shutdown-computevm-<vmName> with taskType ComputeVmShutdownTask.")
        if self.get(target) is None or target.rsplit("/", 1)[-1].lower() != name[len("shutdown-computevm-"):].lower():
            raise ArmError(400, "InvalidTargetResource", f"The target resource '{target}' was not found or does "
                           "not match the schedule's name.")
        time_of_day = str((props.get("dailyRecurrence") or {}).get("time", ""))
        if not re.fullmatch(r"([01][0-9]|2[0-3])[0-5][0-9]", time_of_day) or not props.get("timeZoneId"):
            raise ArmError(400, "InvalidSchedule", "dailyRecurrence.time (HHmm) and timeZoneId are required.")
        created = self.get(path) is None
        self.put(path, {**data, "name": name, "type": "microsoft.devtestlab/schedules",
                        "properties": {**props, "provisioningState": "Succeeded"}})
        return (201 if created else 200), {}, self.get(path)

    @staticmethod
    def _iv(vm: dict[str, Any]) -> dict[str, Any]:
        state = vm.get("_state", {"power": "running"})
        provisioning = vm["properties"].get("provisioningState", "Succeeded")
        statuses = [{"code": f"ProvisioningState/{provisioning.lower()}"}]
        if state.get("fail"):
            statuses = [{"code": f"ProvisioningState/failed/{state['fail']}", "message": "Allocation failed."}]
        if state.get("power"):
            statuses.append({"code": f"PowerState/{state['power']}",
                             "displayStatus": f"VM {state['power']}"})
        # A test sets vm["_iv_extra"] to what Azure adds about the guest: vmAgent statuses, bootDiagnostics.
        return {"statuses": statuses, **vm.get("_iv_extra", {})}

    def _patch_disk(self, rid: str, data: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        """Disks_Update is long-running in Azure (azure-rest-api-specs DiskRP disk.json: 200 or 202 with
        x-ms-long-running-operation): 202 with Azure-AsyncOperation and Location, the change applied when the
        operation completes. A PATCH's tags replace the disk's tags, as ARM's PATCH does."""
        res = self.get(rid)
        if res is None:
            raise ArmError(404, "ResourceNotFound", f"The Resource '{rid}' was not found.")
        res["properties"]["provisioningState"] = "Updating"

        def done() -> None:
            if "tags" in data:
                res["tags"] = dict(data["tags"] or {})
            res["properties"]["provisioningState"] = "Succeeded"

        headers = self._lro(done, "Microsoft.Compute", location=True, seconds=self.disk_update_s)
        return 202, headers, None

    @staticmethod
    def _refuse_bad_vm_request(path: str, props: dict[str, Any]) -> None:
        """What Azure refuses in a Linux VM create before anything is made, with its codes (InvalidParameter
        and the target): a VM name or computer name over 64 characters or with characters Azure does not allow
        (learn.microsoft.com resource-name-rules: Linux names end in neither '.' nor '-'), and custom data
        that is not base64 or decodes to more than 65,535 bytes (OSProfile.customData in azure-rest-api-specs;
        87,380 base64 characters)."""
        name = path.rsplit("/", 1)[-1]
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", name) or name[-1] in ".-":
            raise ArmError(400, "InvalidParameter", f"The value '{name}' of parameter 'vmName' is invalid: a Linux "
                           "virtual machine name has 1 to 64 letters, digits, '_', '.' or '-' and cannot end with "
                           "'.' or '-'.", target="vmName")
        os_profile = props.get("osProfile") or {}
        computer = str(os_profile.get("computerName") or name)
        if len(computer) > 64 or re.search(r"[`~!@#$%^&*()=+_\[\]{}\\|;:'\",<>/?\s]", computer):
            raise ArmError(400, "InvalidParameter", "Linux host name cannot exceed 64 characters in length or contain "
                           "the following characters: ` ~ ! @ # $ % ^ & * ( ) = + _ [ ] { } \\ | ; : ' \" , < > / ?.",
                           target="computerName")
        custom = os_profile.get("customData")
        if custom is not None:
            try:
                size = len(base64.b64decode(str(custom), validate=True))
            except (binascii.Error, ValueError):
                size = -1
            if size < 0 or size > 65535:
                raise ArmError(400, "InvalidParameter", "Custom data in OSProfile must be in Base64 encoding and with "
                               "a maximum length of 87380 characters.", target="customData")

    def _put_vm(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        existing = self.get(path)
        if existing is not None:
            return 200, {}, existing
        props = body["properties"]
        self._refuse_bad_vm_request(path, props)
        refusal = self.refuse_sizes.get(str(props.get("hardwareProfile", {}).get("vmSize", "")))
        if refusal and refusal not in ALLOCATION_CODES:
            raise refusal_error(refusal, props["hardwareProfile"]["vmSize"], body["location"])
        image_id = props["storageProfile"]["imageReference"]["id"]
        if not self._readable(image_id):  # ARM's linked access check on the referenced image
            raise ArmError(403, "LinkedAuthorizationFailed", (
                f"The client '{CLIENT}' with object id '{CLIENT}' has permission to perform action "
                f"'Microsoft.Compute/virtualMachines/write' on scope '{path}'; however, it does not have permission "
                f"to perform action(s) '{rbac_action('GET', image_id)}' on the linked scope(s) '{image_id}' "
                "(respectively) or the linked scope(s) are invalid."))
        if self.get(image_id) is None:
            raise ArmError(404, "ImageNotFound", f"image {image_id} not found")
        for ref in props["networkProfile"]["networkInterfaces"]:
            nic = self.get(ref["id"])
            if nic is None:
                raise ArmError(400, "InvalidResourceReference", f"network interface {ref['id']} not found")
            if nic["properties"].get("virtualMachine"):
                raise ArmError(400, "NicInUse", "network interface is in use by another VM")
        rg_prefix = path.rsplit("/providers/", 1)[0]
        os_disk = props["storageProfile"]["osDisk"]
        disk_id = f"{rg_prefix}/providers/Microsoft.Compute/disks/{os_disk['name']}"
        vm = {
            "id": path, "name": path.rsplit("/", 1)[-1], "type": "Microsoft.Compute/virtualMachines",
            "location": body["location"], "tags": body.get("tags") or {},
            "properties": {**json.loads(json.dumps(props)), "provisioningState": "Creating",
                           "vmId": str(uuid.uuid4()), "timeCreated": dt.datetime.now(dt.UTC).isoformat()},
            "_state": {"power": "starting"},
        }
        vm["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"] = disk_id
        vm["properties"].pop("osProfile", None)  # never echoed with secrets; keep the fake simple
        vm["_custom_data"] = props["osProfile"].get("customData")
        vm["_os_profile"] = props["osProfile"]
        self.resources[path.lower()] = vm
        for ref in props["networkProfile"]["networkInterfaces"]:
            self.get(ref["id"])["properties"]["virtualMachine"] = {"id": path}  # type: ignore[index]
        failure = self.allocation_failure or refusal

        def done() -> None:
            # Azure creates the disk (untagged: VM tags do not propagate) whether or not allocation succeeds.
            self.put(disk_id, {"type": "Microsoft.Compute/disks", "location": body["location"], "tags": {},
                               "managedBy": path, "sku": {"name": os_disk["managedDisk"]["storageAccountType"]},
                               "properties": {"diskSizeGB": os_disk.get("diskSizeGB"), "diskState": "Attached",
                                              "provisioningState": "Succeeded",
                                              "timeCreated": dt.datetime.now(dt.UTC).isoformat()}})
            if failure:
                vm["properties"]["provisioningState"] = "Failed"
                vm["_state"] = {"fail": failure}
            else:
                vm["properties"]["provisioningState"] = "Succeeded"
                vm["_state"] = {"power": "running"}

        error = {"code": failure, "message": ALLOCATION_MESSAGE} if failure else None
        public = {k: v for k, v in vm.items() if not k.startswith("_")}
        return 201, self._lro(done, "Microsoft.Compute", error=error), public

    def _put_nic(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        for cfg in body["properties"]["ipConfigurations"]:
            if "publicIPAddress" in cfg["properties"]:
                raise ArmError(400, "FakeRefusesPublicIp", "the adapter must not attach a public IP")
            if self.get(cfg["properties"]["subnet"]["id"]) is None:
                raise ArmError(400, "InvalidResourceReference", "subnet not found")
        existing = self.get(path)
        nic = {"id": path, "name": path.rsplit("/", 1)[-1], "type": "Microsoft.Network/networkInterfaces",
               "location": body["location"], "tags": body.get("tags") or {},
               "properties": {**body["properties"], "provisioningState": "Updating"}}
        if existing is not None:
            nic["properties"]["virtualMachine"] = existing["properties"].get("virtualMachine")
        self.resources[path.lower()] = nic

        def done() -> None:
            nic["properties"]["provisioningState"] = "Succeeded"

        return 201, self._lro(done, "Microsoft.Network"), nic

    def _vm_action(self, vm_id: str, action: str, method: str) -> tuple[int, dict[str, str], Any]:
        vm = self.get(vm_id)
        if vm is None:
            raise ArmError(404, "ResourceNotFound", "vm not found")
        if action == "instanceview":
            return 200, {}, self._iv(vm)
        if action == "retrievebootdiagnosticsdata":
            if method != "POST":
                raise ArmError(405, "MethodNotAllowed", "POST only")
            if not ((vm["properties"].get("diagnosticsProfile") or {}).get("bootDiagnostics") or {}).get("enabled"):
                raise ArmError(409, "OperationNotAllowed", "Boot diagnostics is not enabled for this virtual machine.")
            sig = secrets.token_urlsafe(24)
            self.sas[sig] = vm_id.lower()
            base = f"{self.url}/bootdiag/{vm['name']}"
            sas = f"sv=2024-08-04&sr=b&sp=r&se=2099-01-01T00%3A00%3A00Z&sig={sig}"
            return 200, {}, {"consoleScreenshotBlobUri": f"{base}/screenshot.bmp?{sas}",
                             "serialConsoleLogBlobUri": f"{base}/serialconsole.log?{sas}"}
        transient, final = {"deallocate": ("deallocating", "deallocated"), "start": ("starting", "running"),
                            "poweroff": ("stopping", "stopped")}[action]
        vm["_state"] = {"power": transient}

        def done() -> None:
            vm["_state"] = {"power": final}

        return 202, self._lro(done, "Microsoft.Compute", location=True), None

    def _serial_log(self, method: str, query: dict[str, list[str]], headers: Any) -> tuple[int, dict[str, str], Any]:
        """A boot diagnostics blob behind its SAS URI: 403 without a signature this server issued."""
        vm_id = self.sas.get(query.get("sig", [""])[0])
        if vm_id is None:
            return 403, {}, {"error": {"code": "AuthenticationFailed", "message": "Signature did not match."}}
        vm = self.resources.get(vm_id) or {}
        data = str(vm.get("_console", "[    0.000000] Linux version 6.8.0-azure\ncloud-init: modules:final "
                                       "finished\n")).encode()
        wanted = headers.get("Range", "")
        self.blob_reads.append((method, wanted))
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted)
        if method == "HEAD" or not m:
            return 200, {"Content-Type": "text/plain"}, data
        start, end = int(m.group(1)), int(m.group(2) or len(data) - 1)
        if start >= len(data):
            return 416, {}, {"error": {"code": "InvalidRange", "message": "The range specified is invalid."}}
        part = data[start:end + 1]
        return 206, {"Content-Type": "text/plain",
                     "Content-Range": f"bytes {start}-{start + len(part) - 1}/{len(data)}"}, part

    def _delete(self, rid: str, kind: str) -> tuple[int, dict[str, str], Any]:
        res = self.get(rid)
        if res is None:
            return 204, {}, None
        if kind == "disk" and res.get("managedBy"):
            raise ArmError(409, "OperationNotAllowed", f"Disk is attached to VM {res['managedBy']}.")
        if kind == "nic" and res["properties"].get("virtualMachine"):
            raise ArmError(400, "NicInUse", "Network interface is in use by a virtual machine.")
        if kind == "nic" and now_ts() < res.get("_reserved_until", 0.0):
            raise ArmError(400, "NicReservedForAnotherVm", (
                f"Nic(s) in request is reserved for another Virtual Machine for {int(self.nic_reserved_s)} seconds. "
                f"Please provide another nic(s) or retry after {int(self.nic_reserved_s)} seconds. Reserved VM: "
                f"{res.get('_reserved_for', '')}"))
        if kind == "vm":
            res["properties"]["provisioningState"] = "Deleting"
        provider = "Microsoft.Network" if kind == "nic" else "Microsoft.Compute"

        def done() -> None:
            self.resources.pop(rid.lower(), None)
            if kind != "vm":
                return
            os_disk = res["properties"]["storageProfile"]["osDisk"]
            disk = self.get(os_disk["managedDisk"]["id"])
            if disk is not None:
                if os_disk.get("deleteOption") == "Delete":
                    self.resources.pop(disk["id"].lower(), None)
                else:
                    disk["managedBy"] = None
            for d in res["properties"]["storageProfile"].get("dataDisks") or []:
                data_disk = self.get(d["managedDisk"]["id"])
                if data_disk is not None:
                    data_disk["managedBy"] = None
            for ref in res["properties"]["networkProfile"]["networkInterfaces"]:
                nic = self.get(ref["id"])
                if nic is None:
                    continue
                if (ref.get("properties") or {}).get("deleteOption") == "Delete" and not self.keep_nic_on_vm_delete:
                    self.resources.pop(nic["id"].lower(), None)
                else:
                    nic["properties"]["virtualMachine"] = None
                    nic["_reserved_until"] = now_ts() + self.nic_reserved_s
                    nic["_reserved_for"] = res["id"]

        return 202, self._lro(done, provider, location=True), None


def rbac_action(method: str, path: str) -> str:
    """The RBAC action ARM names for a request on a resource path, e.g. GET .../galleries/g/images/i ->
    Microsoft.Compute/galleries/images/read (types are every other segment after the namespace)."""
    after = path.split("/providers/", 1)[-1].split("/")
    namespace, rest = after[0], after[1:]
    types = [rest[i] for i in range(0, len(rest), 2)]
    verb = {"GET": "read", "PUT": "write", "PATCH": "write", "DELETE": "delete"}.get(method, "action")
    return "/".join([namespace, *types, verb])


def _kind(low_path: str) -> str:
    if "/providers/microsoft.compute/virtualmachines/" in low_path:
        return "vm"
    if "/providers/microsoft.compute/disks/" in low_path:
        return "disk"
    if "/providers/microsoft.network/networkinterfaces/" in low_path:
        return "nic"
    return "other"


def _public(obj: Any) -> Any:
    """Drop the fake's private bookkeeping keys (leading underscore) before sending."""
    if isinstance(obj, dict):
        return {k: _public(v) for k, v in obj.items() if not k.startswith("_")}
    if isinstance(obj, list):
        return [_public(v) for v in obj]
    return obj


def _handler(fake: FakeArm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # headers and body go out in two writes: without this, Nagle + delayed ACK add ~40 ms a request
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, headers, payload = fake.handle(self.command, self.path, self.headers, body)
            # bytes: a blob (the boot diagnostics serial log); anything else is ARM JSON
            raw = payload if isinstance(payload, bytes) else b"" if payload is None else json.dumps(
                _public(payload)).encode()
            self.send_response(status)
            if raw and "Content-Type" not in headers:
                self.send_header("Content-Type", "application/json")
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("x-ms-request-id", uuid.uuid4().hex)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

        do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _serve

    return Handler
