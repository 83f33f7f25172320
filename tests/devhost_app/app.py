"""Sample app: an HTTP route with a route parameter, a queue trigger that fails on "poison", timers.

Queue name and timer schedule come from app settings (%NAME%), so each test picks its own.
`CALLS` records invocations for the tests to assert on.
"""

from __future__ import annotations

import json
import os
import threading
import time

import azure.functions as func

app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)

CALLS: list[tuple[str, object]] = []
_lock = threading.Lock()
_running = 0
MAX_CONCURRENT = 0
# What "hang" waits for: a stuck function. Set at the end of each test (reset()), so abandoned
# threads of a restarted worker end.
RELEASE = threading.Event()


def record(name: str, value: object) -> None:
    with _lock:
        CALLS.append((name, value))


def reset() -> None:
    global MAX_CONCURRENT, RELEASE
    RELEASE.set()
    RELEASE = threading.Event()
    with _lock:
        CALLS.clear()
        MAX_CONCURRENT = 0


@app.route(route="items/{id:int}", methods=["GET"])
def get_item(req: func.HttpRequest) -> func.HttpResponse:
    body = {"id": int(req.route_params["id"]), "q": req.params.get("q"), "url": req.url,
            "auth": req.headers.get("authorization")}
    return func.HttpResponse(json.dumps(body), mimetype="application/json")


@app.route(route="items/special", methods=["GET"])
def special_item(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse("special")


@app.route(route="echo", methods=["POST", "PUT"])
def echo(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(req.get_body(), status_code=201, headers={"X-Echo-Method": req.method},
                             mimetype=req.headers.get("content-type") or "application/octet-stream")


@app.route(route="settings/{name}", methods=["GET"])
def setting(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(os.environ.get(req.route_params["name"], ""))


@app.route(route="boom", methods=["GET"])
def boom(req: func.HttpRequest) -> func.HttpResponse:
    raise RuntimeError("kaboom")


@app.route(route="nothing", methods=["POST"])
def nothing(req: func.HttpRequest) -> func.HttpResponse:
    # A 204 that carries a body, as the control plane's reply({}, 204) does: the host must drop it.
    return func.HttpResponse("{}", status_code=204, mimetype="application/json")


@app.route(route="pid", methods=["GET"])
def pid(req: func.HttpRequest) -> func.HttpResponse:
    time.sleep(0.02)  # long enough that concurrent connections land on several worker processes
    return func.HttpResponse(str(os.getpid()))


@app.route(route="slow", methods=["GET"])
def slow(req: func.HttpRequest) -> func.HttpResponse:
    time.sleep(float(req.params.get("s") or 0.2))
    return func.HttpResponse("done")


@app.route(route="hang", methods=["GET"])
def hang(req: func.HttpRequest) -> func.HttpResponse:
    record("hang", None)
    RELEASE.wait(60)
    return func.HttpResponse("released")


@app.queue_trigger(arg_name="msg", queue_name="%DEVHOST_QUEUE%", connection="AzureWebJobsStorage")
def work(msg: func.QueueMessage) -> None:
    global _running, MAX_CONCURRENT
    body = msg.get_body().decode()
    record("work", (body, msg.dequeue_count))
    with _lock:
        _running += 1
        MAX_CONCURRENT = max(MAX_CONCURRENT, _running)
    try:
        if body.startswith("slow"):
            time.sleep(0.3)
        if body.startswith("sleep:"):
            time.sleep(float(body.split(":", 1)[1]))
        if body.startswith("hang"):
            RELEASE.wait(60)
        if "poison" in body:
            raise ValueError("this message always fails")
    finally:
        with _lock:
            _running -= 1


@app.timer_trigger(schedule="%DEVHOST_TIMER%", arg_name="timer", run_on_startup=False)
def tick(timer: func.TimerRequest) -> None:
    record("tick", timer.past_due)


@app.timer_trigger(schedule="0 0 0 1 1 *", arg_name="timer", run_on_startup=True)
def startup_tick(timer: func.TimerRequest) -> None:
    record("startup_tick", timer.past_due)
