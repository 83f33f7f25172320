"""A fake RunPod GraphQL API on loopback, for tests.

Hand-written: RunPod publishes no emulator. It understands exactly the operations
shared/providers/runpod sends (podFindAndDeployOnDemand with variables; pod, myself
{ pods | id clientBalance | networkVolumes }, podStop, podResume, podTerminate as the runpod package
formats them; gpuTypes with lowestPrice's input), answers like RunPod does (401 for a
bad key, GraphQL `errors` otherwise), and records every raw request body so a test can
check what arrived. Every request is first checked against the schema RunPod's clients use
(graphql_schema.py): a field, argument or input field it does not define is answered HTTP 400
with graphql-js's words, as RunPod's server answers it, before anything is done.
Each GPU type's hosts report one CUDA version (its "cuda", else HOST_CUDA): a minCudaVersion
(pod create, lowestPrice) admits hosts at or above it, an allowedCudaVersions list (pod create
only) those whose version it names exactly.
Point the code at it with RUNPOD_API_BASE_URL=fake.url.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.providers.runpod import graphql_schema

DEFAULT_GPUS: list[dict[str, Any]] = [
    # id, memory, secure price, community price, datacenters with stock
    {"id": "NVIDIA A40", "displayName": "A40", "memoryInGb": 48, "securePrice": 0.40, "communityPrice": 0.35,
     "dcs": ["EU-RO-1", "EUR-IS-1"]},
    {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24, "securePrice": 0.69,
     "communityPrice": 0.34, "dcs": ["EU-RO-1"]},
    {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80, "securePrice": 2.99,
     "communityPrice": 0, "dcs": ["US-KS-2"]},
    {"id": "NVIDIA L4", "displayName": "L4", "memoryInGb": 24, "securePrice": 0.43, "communityPrice": 0,
     "dcs": ["EUR-IS-1"]},
    {"id": "Tesla T4", "displayName": "Tesla T4", "memoryInGb": 16, "securePrice": 0.20, "communityPrice": 0.1,
     "dcs": ["EU-RO-1"]},
    {"id": "Tesla V100-SXM2-16GB", "displayName": "V100 SXM2", "memoryInGb": 16, "securePrice": 0.3,
     "communityPrice": 0.2, "dcs": ["EU-RO-1"]},
    {"id": "NVIDIA GeForce RTX 2080 Ti", "displayName": "RTX 2080 Ti", "memoryInGb": 11, "securePrice": 0.2,
     "communityPrice": 0.1, "dcs": ["EU-RO-1"]},
    {"id": "AMD Instinct MI300X OAM", "displayName": "MI300X", "memoryInGb": 192, "securePrice": 2.5,
     "communityPrice": 0, "dcs": ["EU-RO-1"]},
]

CAPACITY_MESSAGE = "There are no longer any instances available with the requested specifications. Please refresh."
# The CUDA version a GPU type's hosts report when the GPU does not say ("cuda" in its entry).
HOST_CUDA = "13.0"


class FakeRunPod:
    def __init__(self, api_key: str = "rpa_TESTKEY0123456789") -> None:
        self.api_key = api_key
        self.pods: dict[str, dict[str, Any]] = {}
        self.gpus = [dict(g) for g in DEFAULT_GPUS]
        self.volumes: list[dict[str, Any]] = [
            {"id": "vol0abc123", "name": "tensorant", "size": 100, "dataCenterId": "EU-RO-1"}]
        self.requests: list[dict[str, Any]] = []  # {"raw": bytes, "auth": str, "body": parsed}
        self.price_inputs: list[dict[str, Any]] = []  # each gpuTypes query's lowestPrice input, resolved
        self.balance: float | None = 100.0  # myself.clientBalance (prepaid credit, USD); None = not answered
        self.account_id = "user_fake"
        self.lock = threading.Lock()
        # Fault injection.
        self.create_error = ""  # GraphQL error message for the next creates
        self.sold_out: set[str] = set()  # GPU type ids whose creates RunPod answers CAPACITY_MESSAGE (no stock)
        self.resume_error = ""
        self.phantom_create = False  # answer a create with an id but never keep the pod
        self.terminate_lag = 0  # gets that still return a terminated pod before it vanishes
        self.http_status = 0  # answer every call with this status (e.g. 500)
        self.refuse_400 = ""  # answer every call HTTP 400 with this GraphQL error message
        self.refuse_all = ""  # answer every call (HTTP 200) with this GraphQL error message
        self.permission_denied: set[str] = set()  # operation names answered "not authorized"
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> FakeRunPod:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------ test helpers

    def add_pod(self, name: str, status: str = "RUNNING") -> str:
        pod_id = secrets.token_hex(7)
        self.pods[pod_id] = self._pod(pod_id, name, status)
        return pod_id

    def creates(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests if "podFindAndDeployOnDemand" in r["body"].get("query", "")]

    def ops(self) -> list[str]:
        names = []
        for r in self.requests:
            m = re.search(r"(podFindAndDeployOnDemand|podStop|podResume|podTerminate|gpuTypes|networkVolumes|pods"
                          r"|pod\(|myself)", r["body"].get("query", ""))
            names.append(m.group(1).rstrip("(") if m else "?")
        return names

    # ------------------------------------------------------------ the API

    @staticmethod
    def _pod(pod_id: str, name: str, status: str, **extra: Any) -> dict[str, Any]:
        return {"id": pod_id, "name": name, "desiredStatus": status, "imageName": extra.get("imageName", "img"),
                "costPerHr": extra.get("costPerHr", 0.4), "gpuCount": 1, "volumeInGb": extra.get("volumeInGb", 0),
                "containerDiskInGb": extra.get("containerDiskInGb", 20),
                "runtime": {"uptimeInSeconds": 1} if status == "RUNNING" else None,
                "lastStatusChange": extra.get("lastStatusChange", f"Rented by User: {status.lower()}"),
                "env": extra.get("env", []), "input": extra.get("input", {}), "_gone_after": -1}

    def _public(self, pod: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in pod.items() if not k.startswith("_") and k not in ("env", "input")}

    def answer(self, query: str, variables: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The HTTP status and body for one authenticated request: 400 for one the schema refuses."""
        _, errors = graphql_schema.validate(query, variables)
        if errors:
            return 400, {"errors": [{"message": m, "extensions": {"code": "GRAPHQL_VALIDATION_FAILED"}}
                                    for m in errors]}
        return 200, self.handle(query, variables)

    def handle(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        for op in self.permission_denied:
            if op in query:
                return {"errors": [{"message": "You are not authorized to perform this action"}]}
        pod_id_match = re.search(r'podId:\s*"([^"]*)"', query)
        pod_id = pod_id_match.group(1) if pod_id_match else ""
        if "podFindAndDeployOnDemand" in query:
            return self._create(variables.get("input") or {})
        if "podStop" in query:
            pod = self.pods.get(pod_id)
            if not pod:
                return {"errors": [{"message": "Pod not found"}]}
            pod.update(desiredStatus="EXITED", runtime=None)
            return {"data": {"podStop": {"id": pod_id, "desiredStatus": "EXITED"}}}
        if "podResume" in query:
            pod = self.pods.get(pod_id)
            if not pod:
                return {"errors": [{"message": "Pod not found"}]}
            if self.resume_error:
                return {"errors": [{"message": self.resume_error}]}
            pod.update(desiredStatus="RUNNING", runtime={"uptimeInSeconds": 0})
            return {"data": {"podResume": {"id": pod_id, "desiredStatus": "RUNNING"}}}
        if "podTerminate" in query:
            pod = self.pods.get(pod_id)
            if not pod:
                return {"errors": [{"message": "Pod not found"}]}
            pod.update(desiredStatus="TERMINATED", runtime=None, _gone_after=self.terminate_lag)
            self._expire(pod_id)
            return {"data": {"podTerminate": None}}
        if re.search(r"\bpod\(", query):
            pod = self.pods.get(pod_id)
            if pod is not None:
                pod = self._public(pod)
                self._expire(pod_id, count=True)
            return {"data": {"pod": pod}}
        if "gpuTypes" in query:
            return {"data": {"gpuTypes": self._gpu_types(query, variables)}}
        if "networkVolumes" in query:
            return {"data": {"myself": {"networkVolumes": self.volumes}}}
        if "pods" in query:
            pods = [self._public(p) for p in self.pods.values()]
            for listed in pods:
                self._expire(listed["id"], count=True)
            return {"data": {"myself": {"pods": pods}}}
        if "myself" in query:
            myself: dict[str, Any] = {"id": self.account_id, "email": "owner@example.com"}
            if "clientBalance" in query:
                myself["clientBalance"] = self.balance
            return {"data": {"myself": myself}}
        return {"errors": [{"message": f"Cannot query field in: {query[:60]}"}]}

    def _expire(self, pod_id: str, count: bool = False) -> None:
        """A terminated pod stays visible for `terminate_lag` reads, then vanishes."""
        pod = self.pods[pod_id]
        if pod["_gone_after"] < 0:
            return
        if count:
            pod["_gone_after"] -= 1
        if pod["_gone_after"] <= 0:
            del self.pods[pod_id]

    def _create(self, inp: dict[str, Any]) -> dict[str, Any]:
        if self.create_error:
            return {"errors": [{"message": self.create_error}]}
        gpu = next((g for g in self.gpus if g["id"] == inp.get("gpuTypeId")), None)
        if gpu is None:
            return {"errors": [{"message": "Invalid GPU type"}]}
        if gpu["id"] in self.sold_out:
            return {"errors": [{"message": CAPACITY_MESSAGE}]}
        dc = inp.get("dataCenterId")
        if dc and dc not in gpu["dcs"]:
            return {"errors": [{"message": CAPACITY_MESSAGE}]}
        if not _cuda_ok(gpu, inp.get("minCudaVersion"), inp.get("allowedCudaVersions")):
            return {"errors": [{"message": CAPACITY_MESSAGE}]}  # no host with an allowed CUDA version
        pod_id = secrets.token_hex(7)
        pod = self._pod(pod_id, inp.get("name", ""), "RUNNING", imageName=inp.get("imageName"),
                        env=inp.get("env", []), input=inp, volumeInGb=inp.get("volumeInGb", 0),
                        containerDiskInGb=inp.get("containerDiskInGb", 0), costPerHr=gpu["securePrice"])
        if not self.phantom_create:
            self.pods[pod_id] = pod
        return {"data": {"podFindAndDeployOnDemand": self._public(pod)}}

    def _gpu_types(self, query: str, variables: dict[str, Any]) -> list[dict[str, Any]]:
        """Every GPU type; lowestPrice answers for the hosts its input admits (cloud, datacenter, CUDA
        minimum): no such host in stock = stockStatus and price null, as RunPod answers."""
        lowest = graphql_schema.parse(query).find("gpuTypes", "lowestPrice")
        asked = graphql_schema.resolve(lowest.args["input"], variables) if lowest and "input" in lowest.args else None
        asked = asked or {}
        dc, secure = asked.get("dataCenterId"), asked.get("secureCloud")
        self.price_inputs.append(asked)
        out = []
        for g in self.gpus:
            in_cloud = True if secure is None else g["securePrice"] > 0 if secure else g["communityPrice"] > 0
            in_stock = in_cloud and (dc is None or dc in g["dcs"]) and _cuda_ok(g, asked.get("minCudaVersion"), None)
            price = g["communityPrice"] if secure is False else g["securePrice"]
            out.append({"id": g["id"], "displayName": g["displayName"], "memoryInGb": g["memoryInGb"],
                        "secureCloud": g["securePrice"] > 0, "communityCloud": g["communityPrice"] > 0,
                        "securePrice": g["securePrice"], "communityPrice": g["communityPrice"],
                        "lowestPrice": {"uninterruptablePrice": price if in_stock else None,
                                        "stockStatus": "High" if in_stock else None}})
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                auth = self.headers.get("Authorization", "")
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                answer: dict[str, Any]
                with fake.lock:
                    fake.requests.append({"raw": raw, "auth": auth, "body": body, "path": self.path})
                    if self.path != "/graphql":
                        status, answer = 404, {"error": "not found"}
                    elif fake.http_status:
                        status, answer = fake.http_status, {"error": "injected"}
                    elif fake.refuse_400:
                        status, answer = 400, {"errors": [{"message": fake.refuse_400}]}
                    elif fake.refuse_all:
                        status, answer = 200, {"data": None, "errors": [{"message": fake.refuse_all}]}
                    elif auth != f"Bearer {fake.api_key}":
                        status, answer = 401, {"error": "Unauthorized"}
                    else:
                        status, answer = fake.answer(body.get("query", ""), body.get("variables") or {})
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _cuda_ok(gpu: dict[str, Any], minimum: str | None, allowed: list[str] | None) -> bool:
    """Whether the GPU's hosts pass a minCudaVersion (numeric, at or above) and an allowedCudaVersions
    list (exact strings); None or empty = no filter."""
    host = gpu.get("cuda", HOST_CUDA)
    if minimum and _version(host) < _version(minimum):
        return False
    return not allowed or host in allowed


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))
