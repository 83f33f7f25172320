"""Drive the real function app in-process: HTTP handlers and queue triggers called through
FunctionApp.get_user_function with real HttpRequest / QueueMessage objects, queues on Azurite.

Queue delays are scaled to 0 and the clock is simulated, so "not yet, ask again" loops
run at once and deadlines can be passed without sleeping.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import azure.functions as func

from shared import clock, queues
from shared.context import Context, invocation
from shared.models import Role
from shared.org_storage.base import adapter_key
from shared.queues import Queue, get_queues
from shared.security import mint_agent_token, mint_user_token
from tensorant_devhost.routes import RouteTemplate
from tests.support.clock import FakeClock

SMOKE_MODEL = "tensorant/smoke-tiny"


def smoke_adapter_zip(base_model: str = SMOKE_MODEL, **kw: Any) -> bytes:
    from tests.support.adapters import build_adapter_zip

    return build_adapter_zip(base_model, **kw)


def trained_adapter_zip(base_model: str = SMOKE_MODEL, **kw: Any) -> bytes:
    """What a cloud machine's real trainer exports, as the fake machine of a cloud test plays it:
    the smoke shapes with the real trainer's name (the verifier accepts "smoke" only on local)."""
    return smoke_adapter_zip(base_model, trainer="lora", **kw)


def lift_quotas(org: str) -> None:
    """Many runs at one (simulated) instant: far above the default org limits."""
    from shared.services.api import quotas

    quotas.set_limits(invocation(), org, quotas.OrgLimits(max_active_runs=1000, runs_per_minute=1000))


Route = tuple[str, RouteTemplate, Callable[..., Any]]


def app_functions(app: Any) -> tuple[list[Route], dict[str, Callable[..., Any]], dict[str, Callable[..., Any]]]:
    """The app's user functions: HTTP routes (method, template, function) matched as the dev
    host matches them (the Functions route syntax, in ASP.NET precedence), queue functions
    by queue name, timer functions by function name."""
    from shared.function_index import functions_of

    routes: list[Route] = []
    queue_fns: dict[str, Callable[..., Any]] = {}
    timer_fns: dict[str, Callable[..., Any]] = {}
    for fn in functions_of(app):
        trig = fn.get_trigger().get_dict_repr()
        user = fn.get_user_function()
        if trig["type"] == "httpTrigger":
            template = RouteTemplate(trig["route"])
            for m in trig["methods"]:
                routes.append((str(getattr(m, "value", m)), template, user))
        elif trig["type"] == "queueTrigger":
            queue_fns[trig["queueName"]] = user
        elif trig["type"] == "timerTrigger":
            timer_fns[fn.get_function_name()] = user
    routes.sort(key=lambda r: r[1].precedence)
    return routes, queue_fns, timer_fns


class ApiError(AssertionError):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class Harness:
    def __init__(self, org: str = "org-a", *, deliver_twice: bool = False, max_dequeue: int = 5) -> None:
        import function_app

        self.app = function_app.app
        self.org = org
        self.deliver_twice = deliver_twice
        self.max_dequeue = max_dequeue
        self.clock = FakeClock(time.time())
        clock.set_clock(self.clock)
        self._undo_queues = queues.configure(delay_scale=0)
        # Delays are not waited for; instead a delayed message moves the simulated clock to its
        # due time when it is delivered, so "ask again in 60 s" loops end as they would for real.
        self._due: dict[str, float] = {}
        self._queues = get_queues()
        self._send = self._queues.send
        self._queues.send = self._send_later  # type: ignore[method-assign]
        self.routes, self.queue_fns, self.timer_fns = app_functions(self.app)
        self.owner = mint_user_token("owner@a", org, Role.owner, ttl_s=90 * 86400)
        self.member = mint_user_token("member@a", org, Role.member, ttl_s=90 * 86400)
        self.admin = mint_user_token("admin@platform", org, Role.admin, ttl_s=90 * 86400)
        self.step_errors: list[str] = []
        self.deliveries = 0

    @property
    def ctx(self) -> Context:
        """The invocation context a service, step or timer called directly gets, as the edges build it: read
        afresh, so it follows settings a test changed after the harness started."""
        return invocation()

    def close(self) -> None:
        clock.set_clock(None)
        self._undo_queues()
        self._queues.send = self._send  # type: ignore[method-assign]

    def _send_later(self, queue: Any, body: Any, delay_s: float = 0) -> None:
        if delay_s:
            key = queues.encode(body)
            self._due[key] = max(self._due.get(key, 0.0), self.clock() + delay_s)
        self._send(queue, body, delay_s)

    # ------------------------------------------------------------ HTTP
    def call(self, method: str, path: str, *, token: str | None = "owner", json_body: Any = None,
             body: bytes | None = None, content_type: str = "application/json",
             params: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
        route = path.removeprefix("/api/").split("?")[0]
        # (The walrus name must not be `params`: it would overwrite the query parameters.)
        found = [(matched, fn) for m, template, fn in self.routes
                 if m == method and (matched := template.match(route)) is not None]
        if not found:
            raise AssertionError(f"no route for {method} {path}")
        route_params, user = found[0]
        tok = {"owner": self.owner, "member": self.member, "admin": self.admin}.get(token or "", token)
        headers = {"Content-Type": content_type}
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        data = body if body is not None else (json.dumps(json_body).encode() if json_body is not None else b"")
        if data:
            headers["Content-Length"] = str(len(data))  # as every HTTP client sends it
        req = func.HttpRequest(method, f"http://localhost:7071/api/{route}", headers=headers, params=params or {},
                               route_params=route_params, body=data)
        resp = user(req)
        raw = resp.get_body()
        parsed = json.loads(raw) if raw and (resp.mimetype or "").endswith("json") else raw
        return resp.status_code, parsed, dict(resp.headers)

    def ok(self, method: str, path: str, **kw: Any) -> Any:
        status, body, _ = self.call(method, path, **kw)
        if status >= 400:
            raise ApiError(status, body)
        return body

    # ------------------------------------------------------------ queues
    def drain(self, max_rounds: int = 200) -> int:
        """Deliver every visible message until all queues are empty; returns deliveries."""
        handled = 0
        for _ in range(max_rounds):
            delivered = self.deliver_round()
            if not delivered:
                return handled
            handled += delivered
        raise AssertionError("queues did not drain: a step keeps re-sending itself")

    def deliver_round(self, max_messages: int | None = None) -> int:
        """One round over the queues: each one's visible messages (at most max_messages a queue) delivered;
        returns how many. Tests whose steps wait by re-sending themselves step the clock between rounds
        instead of draining (drain would spin)."""
        handled = 0
        q = get_queues()
        for queue in Queue:
            client = q.client(queue.value)
            for m in client.receive_messages(messages_per_page=16, max_messages=max_messages, visibility_timeout=60):
                handled += 1
                self._deliver(queue, client, m)
        return handled

    def _deliver(self, queue: Queue, client: Any, m: Any) -> None:
        due = self._due.pop(m.content, None)
        if due is not None and due > self.clock.t:
            self.clock.t = due
        body = base64.b64decode(m.content)
        msg = func.QueueMessage(id=m.id, body=body, pop_receipt=m.pop_receipt)
        fn = self.queue_fns[queue.value]
        try:
            for _ in range(2 if self.deliver_twice else 1):
                self.deliveries += 1
                fn(msg)
        except Exception as exc:
            self.step_errors.append(f"{queue.value}: {type(exc).__name__}: {exc}")
            if m.dequeue_count >= self.max_dequeue:
                get_queues().client(queue.poison).send_message(m.content)
                client.delete_message(m.id, m.pop_receipt)
            else:
                client.update_message(m.id, m.pop_receipt, visibility_timeout=0)
            return
        client.delete_message(m.id, m.pop_receipt)

    def tick(self, name: str) -> None:
        from azure.functions.timer import TimerRequest

        self.timer_fns[name](TimerRequest(past_due=False))

    def serve(self, seconds: float, step: float = 60) -> None:
        """The control plane serves for `seconds`: heartbeat-check ticks now, then every `step` (its
        timer fires every minute) as the clock moves. A bare clock jump followed by one tick reads as
        an outage of the control plane, after which heartbeat-check judges no silence for a full
        heartbeat interval (shared/services/timers/heartbeat_check.serving_since). The queues are
        drained after each tick, as the host runs what a tick sends."""
        self.tick("heartbeat_check")
        self.drain()
        left = seconds
        while left > 0:
            self.clock.advance(min(step, left))
            left -= step
            self.tick("heartbeat_check")
            self.drain()

    def served(self, seconds: float) -> None:
        """The clock moves `seconds` while the control plane serves all along, without running the days of
        ticks between: the liveness record says its last tick was a minute ago (as every tick would have
        left it), so the next tick continues the serving period rather than reading a jump."""
        from shared.services.timers.heartbeat_check import LIVENESS
        from shared.store import get_store

        table = get_store().table("watch")
        got = table.get(*LIVENESS)
        row = got[0] if got else {"org": "~", "run_id": "~", "serving_since": self.clock.t}
        self.clock.advance(seconds)
        table.upsert(*LIVENESS, {**row, "last_tick": self.clock.t - 60})

    # ------------------------------------------------------------ flows
    def save_compute(self, provider: str, body: dict[str, Any]) -> Any:
        self.ok("PUT", f"/api/connections/compute/{provider}", json_body=body)
        self.drain()
        return self.ok("GET", f"/api/connections/compute/{provider}")

    def save_storage(self, body: dict[str, Any]) -> Any:
        self.ok("PUT", "/api/connections/storage", json_body=body)
        self.drain()
        return self.ok("GET", "/api/connections/storage")

    def project_and_dataset(self, rows: int = 3) -> tuple[str, str]:
        project = self.ok("POST", "/api/projects", json_body={"name": "demo"})
        lines = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                          {"role": "assistant", "content": f"a{i}"}]}) for i in range(rows)]
        ds = self.ok("POST", f"/api/projects/{project['id']}/datasets", body="\n".join(lines).encode(),
                     content_type="application/x-ndjson")
        return project["id"], ds["id"]

    def create_run(self, provider: str, offer_id: str, *, base_model: str = SMOKE_MODEL,
                   runtime_limit_s: int = 3600, price_limit: float = 100.0, project: tuple[str, str] | None = None,
                   training: dict[str, Any] | None = None) -> str:
        pid, dsid = project or self.project_and_dataset()
        run = self.ok("POST", "/api/runs", token="member", json_body={
            "project_id": pid, "dataset_version_id": dsid, "provider": provider, "offer_id": offer_id,
            "base_model": base_model, "price_limit_per_hour": price_limit, "runtime_limit_s": runtime_limit_s,
            **({"training": training} if training is not None else {})})
        return str(run["id"])

    def launch(self, run_id: str) -> Any:
        self.ok("POST", f"/api/runs/{run_id}/launch", token="member", json_body={"confirm": True})
        self.drain()
        return self.get_run(run_id)

    def get_run(self, run_id: str) -> Any:
        return self.ok("GET", f"/api/runs/{run_id}")

    def agent(self, run_id: str) -> TestAgent:
        return TestAgent(self, run_id)

    def expire(self, run_id: str) -> Any:
        run = self.get_run(run_id)
        self.clock.advance(run["runtime_limit_s"] + 24 * 3600)
        self.tick("heartbeat_check")
        self.drain()
        return self.get_run(run_id)

    def recover(self, run_id: str, upload: bytes | None = None) -> Any:
        if upload is not None:
            self.ok("POST", f"/api/runs/{run_id}/recover", body=upload, content_type="application/zip")
        else:
            self.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "verify_saved"})
        self.drain()
        return self.get_run(run_id)


class TestAgent:
    """Plays the machine's agent: the same HTTP calls the real agent makes, with the run's token."""

    __test__ = False

    def __init__(self, harness: Harness, run_id: str) -> None:
        self.h = harness
        self.run_id = run_id
        self.token = mint_agent_token(harness.org, run_id)

    def heartbeat(self, phase: str, progress: float = 0.0, logs: list[str] | None = None) -> Any:
        return self.h.ok("POST", f"/api/agent/runs/{self.run_id}/heartbeat", token=self.token,
                         json_body={"phase": phase, "progress": progress, "logs": logs or []})

    def upload(self, data: bytes) -> None:
        from shared.runs.org_backends import storage_for

        storage_for(self.h.ctx, self.h.org).put(adapter_key(self.run_id), data)

    def complete_ok(self, data: bytes) -> Any:
        self.upload(data)
        out = self.h.ok("POST", f"/api/agent/runs/{self.run_id}/complete", token=self.token, json_body={
            "status": "ok", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
        self.h.drain()
        return out

    def complete_failed(self, reason: str, exit_code: int = 1) -> Any:
        out = self.h.ok("POST", f"/api/agent/runs/{self.run_id}/complete", token=self.token, json_body={
            "status": "failed", "reason": reason, "exit_code": exit_code})
        self.h.drain()
        return out

    def train(self, data: bytes) -> Any:
        for phase, p in (("preparing", 0.0), ("training", 0.5), ("training", 1.0), ("exporting", 1.0)):
            self.heartbeat(phase, p, [f"{phase} {p}"])
        return self.complete_ok(data)
