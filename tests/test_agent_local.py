"""The agent and the local compute provider, end to end on this host.

The control plane's agent API is played by a small loopback HTTP server that records
heartbeats and completions (a hand-written fake: the real handlers are tested elsewhere,
and these tests must not depend on them). The agent runs as a real detached process
started by LocalCompute, with the smoke trainer.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from adapter_format.verify import verify_adapter
from machine.agent.agent import Agent
from machine.agent.config import AgentConfig, BootstrapError, overlay_bootstrap
from machine.agent.transport import with_retries
from shared.errors import PermanentError
from shared.models import GpuOffer, MachineState
from shared.org_storage.base import ObjectMissing, adapter_key, dataset_key, logs_key
from shared.org_storage.config import LocalStorageConfig
from shared.org_storage.local import LocalStorage
from shared.providers.base import Bootstrap, LaunchSpec, RunRef
from shared.providers.local.compute import LocalCompute, scan
from shared.providers.local.config import LocalConfig
from shared.settings import Settings

TOKEN = "run-token-" + "s3cr3t" * 4
POLL = 0.05


class FakeAgentApi:
    """Records POST /api/agent/runs/{id}/{heartbeat,complete}; can fail the first N of a kind."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any], str]] = []  # (run, what, body, auth)
        self.fail: dict[str, list[int]] = {}  # what -> status codes to answer first
        self.objects: dict[str, bytes] = {}  # a presigned-URL object store: path -> bytes
        # what -> reply bodies to answer in turn (the last one repeats); none: {}
        self.replies: dict[str, list[dict[str, Any]]] = {}
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = api.objects.get(self.path.split("?")[0])
                self.send_response(200 if data is not None else 404)
                self.end_headers()
                self.wfile.write(data or b"")

            def do_PUT(self) -> None:
                api.objects[self.path.split("?")[0]] = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.end_headers()

            def do_POST(self) -> None:
                parts = self.path.strip("/").split("/")  # api agent runs <id> <what>
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                what = parts[-1]
                codes = api.fail.get(what, [])
                status = codes.pop(0) if codes else 200
                if status == 200:
                    api.calls.append((parts[3], what, body, self.headers.get("Authorization", "")))
                answers = api.replies.get(what) or [{}]
                reply = answers.pop(0) if len(answers) > 1 else answers[0]
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(reply).encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, run_id: str, what: str) -> list[dict[str, Any]]:
        return [body for run, w, body, _ in list(self.calls) if run == run_id and w == what]

    def wait_complete(self, run_id: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.of(run_id, "complete")
            if done:
                return done[0]
            time.sleep(POLL)
        raise AssertionError(f"no completion for {run_id}; calls: {self.calls}")


@pytest.fixture
def api() -> Iterator[FakeAgentApi]:
    fake = FakeAgentApi()
    yield fake
    fake.server.shutdown()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A deployment of its own (so other tests' processes are never seen), storage with a dataset."""
    settings = Settings(deployment_id="lt" + secrets.token_hex(3), local_root=str(tmp_path / "local"),
                        trainer_command=f"{sys.executable} -m machine.trainer.smoke")  # the fast trainer
    storage = LocalStorage(LocalStorageConfig(), tmp_path / "storage")
    storage.put(dataset_key("p1", "d1"), b'{"text": "a"}\n{"text": "b"}\n\n{"text": "c"}\n')
    yield {"settings": settings, "storage": storage, "tmp": tmp_path}
    # Whatever a test left running for its deployment is killed and removed.
    compute = LocalCompute(LocalConfig(), settings)
    for res in list(compute.list_managed()):
        compute.release(RunRef(settings.deployment_id, res.org or "o1", res.run_id), [])


def spec_for(world: dict[str, Any], api: FakeAgentApi, run_id: str, **extra_env: str) -> LaunchSpec:
    settings, storage = world["settings"], world["storage"]
    ref = RunRef(deployment=settings.deployment_id, org="o1", run_id=run_id)
    storage_env, _ = storage.agent_env(run_id, dataset_key("p1", "d1"))
    env = {
        "TENSORANT_RUN_ID": run_id,
        "TENSORANT_API_URL": api.url,
        "TENSORANT_RUN_TOKEN": TOKEN,
        "TENSORANT_BASE_MODEL": "tensorant/smoke-tiny",
        "TENSORANT_SMOKE_STEPS": "3",
        "TENSORANT_SMOKE_STEP_SECONDS": "0.05",
        **storage_env,
        **extra_env,
    }
    offer = LocalCompute(LocalConfig(), settings).offers()[0]
    assert isinstance(offer, GpuOffer)
    return LaunchSpec(ref=ref, offer=offer, bootstrap=Bootstrap(container_image="none", env=env,
                                                                secret_env_keys=frozenset({"TENSORANT_RUN_TOKEN"})))


def wait_until(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL)
    raise AssertionError("condition not reached in time")


def settled_count(api: FakeAgentApi, quiet_s: float = 0.5, within_s: float = 10) -> int:
    """The number of calls the fake API got, once none came for quiet_s (at most within_s)."""
    end = time.monotonic() + within_s
    count = len(api.calls)
    while time.monotonic() < end:
        time.sleep(quiet_s)
        if len(api.calls) == count:
            return count
        count = len(api.calls)
    return count


def test_smoke_run_reports_phases_and_a_verifiable_adapter(world: dict[str, Any], api: FakeAgentApi) -> None:
    compute = LocalCompute(LocalConfig(), world["settings"])
    # Heartbeats every 0.1 s; the trainer runs 4 steps of 0.4 s (room for 4 training beats on a busy machine).
    spec = spec_for(world, api, "run-ok", TENSORANT_HEARTBEAT_INTERVAL_S="0.1", TENSORANT_SMOKE_STEPS="4",
                    TENSORANT_SMOKE_STEP_SECONDS="0.4")
    resources = compute.launch(spec)
    assert {r.kind for r in resources} == {"process", "workdir"}
    process = next(r for r in resources if r.kind == "process")
    assert process.run_id == "run-ok" and process.deployment == world["settings"].deployment_id

    # Launching again while it runs finds the same process; no second agent.
    again = compute.launch(spec)
    assert [r.id for r in again if r.kind == "process"] == [process.id]

    done = api.wait_complete("run-ok")
    # A heartbeat in flight as the completion was sent may land just after it: count once it has.
    calls_at_completion = settled_count(api)
    assert done["status"] == "ok"
    stored = world["storage"].get(adapter_key("run-ok"), 10**8)
    assert done["sha256"] == hashlib.sha256(stored).hexdigest() and done["size"] == len(stored)
    result = verify_adapter(stored, base_model="tensorant/smoke-tiny", expected_sha256=done["sha256"])
    assert result.ok, result.problems
    assert result.summary["rows"] == 3 and result.summary["trainer"] == "smoke (no training)"

    beats = api.of("run-ok", "heartbeat")
    phases = [b["phase"] for b in beats]
    order = {"preparing": 0, "training": 1, "exporting": 2}
    assert phases[0] == "preparing" and phases[-1] == "exporting" and "training" in phases
    assert [order[p] for p in phases] == sorted(order[p] for p in phases)
    logs = [line for b in beats for line in b["logs"]]
    assert any(line.startswith("progress=1.000 step=4") for line in logs)
    # Beyond the two at the phase's start and end, the interval's own heartbeats came while it trained.
    assert phases.count("training") >= 4
    assert max(b["progress"] for b in beats if b["phase"] == "training") == 1.0
    assert all(auth == f"Bearer {TOKEN}" for _, _, _, auth in api.calls)

    # The token never reaches a log; logs were uploaded; adapter.zip is on the machine's disk.
    workdir = compute.workdir(spec.ref)
    uploaded = world["storage"].get(logs_key("run-ok"), 10**7).decode()
    assert "progress=" in uploaded
    for text in (uploaded, (workdir / "agent.log").read_text(), "\n".join(logs)):
        assert TOKEN not in text
    assert (workdir / "data" / "adapter.zip").read_bytes() == stored

    # After completing, the agent idles (a VM stays up until retained or released).
    assert compute.describe(spec.ref, resources).state == MachineState.running
    assert len([p for p in scan()[0] if p.run_id == "run-ok"]) == 1

    # retain: the process is stopped, its directory kept.
    outcome = wait_until(lambda: (o := compute.retain(spec.ref, resources)).done and o)
    assert outcome.billing_note == "local: nothing bills"
    assert compute.describe(spec.ref, resources).state == MachineState.stopped
    assert (workdir / "data" / "adapter.zip").exists()
    pid = int(process.id)
    assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"

    # start: running again.
    wait_until(lambda: compute.start(spec.ref, resources).done)
    assert compute.describe(spec.ref, resources).state == MachineState.running

    assert len(api.calls) == calls_at_completion  # idle after completing: nothing more was sent

    # release: process gone and directory removed, confirmed; a second release is still done.
    wait_until(lambda: compute.release(spec.ref, resources).done)
    assert not workdir.exists()
    assert not [p for p in scan()[0] if p.run_id == "run-ok"]
    assert compute.describe(spec.ref, resources).state == MachineState.gone
    assert compute.release(spec.ref, resources).done
    with pytest.raises(PermanentError):
        compute.start(spec.ref, resources)


def test_failing_trainer_reports_failed_with_exit_code(world: dict[str, Any], api: FakeAgentApi) -> None:
    compute = LocalCompute(LocalConfig(), world["settings"])
    spec = spec_for(world, api, "run-fail", TENSORANT_SMOKE_FAIL="7")
    compute.launch(spec)
    done = api.wait_complete("run-fail")
    assert done["status"] == "failed" and done["exit_code"] == 7
    assert "exited with code 7" in done["reason"]
    with pytest.raises(ObjectMissing):
        world["storage"].get(adapter_key("run-fail"), 10**8)
    assert wait_until(lambda: compute.release(spec.ref, []).done)


def test_trainer_without_output_fails_and_transient_errors_are_retried(
        world: dict[str, Any], api: FakeAgentApi) -> None:
    # The configured trainer command wins over the smoke default; `true` writes nothing.
    compute = LocalCompute(LocalConfig(), world["settings"].model_copy(update={"trainer_command": "true"}))
    api.fail["complete"] = [503, 502]  # the control plane is briefly down when the agent reports
    spec = spec_for(world, api, "run-empty")
    compute.launch(spec)
    done = api.wait_complete("run-empty")
    assert done["status"] == "failed" and done["exit_code"] == 0
    assert "wrote no adapter_config.json" in done["reason"]
    assert api.fail["complete"] == []  # both failures were seen, then it got through once
    assert len(api.of("run-empty", "complete")) == 1


def test_retries_stop_on_4xx_and_back_off_with_a_cap() -> None:
    sleeps: list[float] = []
    attempts = {"n": 0}

    def flaky() -> str:
        attempts["n"] += 1
        if attempts["n"] < 8:
            raise urllib.error.URLError(ConnectionRefusedError("refused"))
        return "ok"

    assert with_retries(flaky, give_up_after_s=3600, log=lambda _: None, what="x", sleep=sleeps.append,
                        max_backoff_s=4) == "ok"
    assert sleeps == [0.5, 1, 2, 4, 4, 4, 4]

    def rejected() -> None:
        attempts["n"] += 1
        raise urllib.error.HTTPError("http://x", 409, "Conflict", None, None)  # type: ignore[arg-type]

    attempts["n"] = 0
    with pytest.raises(urllib.error.HTTPError):
        with_retries(rejected, give_up_after_s=3600, log=lambda _: None, what="x", sleep=sleeps.append)
    assert attempts["n"] == 1


def _sleeper(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={"PATH": os.environ.get("PATH", ""), **env}, start_new_session=True)


def test_list_managed_finds_only_this_deployments_marked_leaks(world: dict[str, Any]) -> None:
    settings = world["settings"]
    dep = settings.deployment_id
    marks = {"TENSORANT_MANAGED": "true", "TENSORANT_ORG": "o1"}
    leak = _sleeper({**marks, "TENSORANT_DEPLOYMENT_ID": dep, "TENSORANT_RUN_ID": "leaked"})
    other = _sleeper({**marks, "TENSORANT_DEPLOYMENT_ID": dep + "x", "TENSORANT_RUN_ID": "leaked"})
    plain = _sleeper({"TENSORANT_RUN_ID": "leaked"})  # no managed/deployment marks
    machines = Path(settings.local_root) / "machines"
    (machines / "someone-else").mkdir(parents=True)
    (machines / "someone-else" / "marker.json").write_text(json.dumps({"deployment": dep + "x", "run_id": "r"}))
    (machines / "unmarked").mkdir()
    try:
        compute = LocalCompute(LocalConfig(), settings)
        # The process table is read back until the three children have exec'd.
        found = wait_until(lambda: [r for r in compute.list_managed() if r.kind == "process"])
        assert [(r.id, r.run_id, r.deployment, r.org) for r in found] == [(str(leak.pid), "leaked", dep, "o1")]
        assert [r for r in compute.list_managed() if r.kind == "workdir"] == []

        # Another deployment's run is refused outright; this one's leak is killed.
        with pytest.raises(PermanentError):
            compute.release(RunRef(dep + "x", "o1", "leaked"), [])
        assert wait_until(lambda: compute.release(RunRef(dep, "o1", "leaked"), []).done)
        assert leak.wait(timeout=5) == -signal.SIGKILL
        assert other.poll() is None and plain.poll() is None  # untouched
        assert (machines / "someone-else").exists() and (machines / "unmarked").exists()
    finally:
        for proc in (leak, other, plain):
            proc.kill()
            proc.wait()


def test_validate_and_offers(world: dict[str, Any]) -> None:
    compute = LocalCompute(LocalConfig(price_per_hour=0.25), world["settings"])
    checks = {c.name: c for c in compute.validate()}
    assert checks["work_root"].status == "ok" and checks["agent"].status == "ok"
    assert checks["trainer"].status == "warn" and "smoke" in checks["trainer"].message
    (offer,) = compute.offers()
    assert (offer.offer_id, offer.gpu, offer.total_per_hour, offer.disk_per_hour) == (
        "local-smoke", "none (local CPU)", 0.25, 0.0)


class Bridge:
    """Carries the real agent's HTTP calls into the harness on the test thread, one at a time,
    so the function handlers never run concurrently with the harness's queue draining."""

    def __init__(self) -> None:
        import queue

        self.requests: queue.Queue[tuple[str, dict[str, Any], str, dict[str, Any]]] = queue.Queue()
        bridge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                slot: dict[str, Any] = {"done": threading.Event(), "status": 503}
                bridge.requests.put((self.path, body, token, slot))
                slot["done"].wait(30)
                self.send_response(slot["status"])
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.e2e
def test_local_run_through_the_function_app(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The lead's handlers + the real agent process + the smoke trainer + verify + release."""
    import queue

    from shared import settings as settings_module
    from tests.harness import Harness

    bridge = Bridge()
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", bridge.url)
    settings_module.reset_settings()
    h = Harness()
    run_id = ""
    try:
        h.save_storage({"kind": "local"})
        conn = h.save_compute("local", {})
        assert conn["status"] == "connected", conn
        run_id = h.create_run("local", "local-smoke")
        run = h.launch(run_id)
        assert {r["kind"] for r in run["resources"]} == {"process", "workdir"}
        phases: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                path, body, token, slot = bridge.requests.get(timeout=POLL)
            except queue.Empty:
                continue
            status, _, _ = h.call("POST", path, token=token, json_body=body)
            slot["status"] = status
            slot["done"].set()
            assert status == 200, (path, body)
            phases.append(body.get("phase") or body["status"])
            if path.endswith("/complete"):
                break
        h.drain()
        run = h.get_run(run_id)
        assert run["state"] == "succeeded", run["reason"]
        assert phases[0] == "preparing" and phases[-1] == "ok" and "training" in phases and "exporting" in phases
        assert any("progress=" in line for line in h.ok("GET", f"/api/runs/{run_id}/logs")["lines"])
        assert not [p for p in scan()[0] if p.run_id == run_id]  # released: the agent is gone
        machines = Path(env["TENSORANT_LOCAL_ROOT"]) / "machines"
        assert not [d for d in machines.iterdir() if d.name != ".locks"]
    finally:
        if run_id:
            LocalCompute(LocalConfig(), settings_module.get_settings()).release(
                RunRef(settings_module.get_settings().deployment_id, h.org, run_id), [])
        h.close()
        bridge.server.shutdown()


def test_concurrent_launches_start_one_agent(world: dict[str, Any], api: FakeAgentApi) -> None:
    # At-least-once delivery can run the launch step twice at the same moment.
    compute = LocalCompute(LocalConfig(), world["settings"])
    spec = spec_for(world, api, "run-twice")
    results: list[list[str]] = []

    def launch() -> None:
        results.append(sorted(r.id for r in compute.launch(spec) if r.kind == "process"))

    threads = [threading.Thread(target=launch) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and results[0] == results[1] == results[2] and len(results[0]) == 1
    assert {p.pgid for p in scan()[0] if p.run_id == "run-twice"} == {int(results[0][0])}
    marker = json.loads((compute.workdir(spec.ref) / "marker.json").read_text())
    assert [s["state"] for s in marker["spawns"]] == ["spawned"]  # the write-ahead note, completed once
    assert api.wait_complete("run-twice")["status"] == "ok"
    assert len(api.of("run-twice", "complete")) == 1
    assert wait_until(lambda: compute.release(spec.ref, []).done)


def test_agent_process_with_presigned_urls_hides_secrets_and_exits_on_sigterm(
        tmp_path: Path, api: FakeAgentApi) -> None:
    """The cloud path: presigned GET/PUT URLs instead of a directory; the agent run directly."""
    signature = "?X-Amz-Signature=presigned" + "f00d" * 8
    api.objects["/bucket/datasets/d1.jsonl"] = b'{"text": "a"}\n{"text": "b"}\n'
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "TENSORANT_RUN_ID": "run-url",
        "TENSORANT_API_URL": api.url,
        "TENSORANT_RUN_TOKEN": TOKEN,
        "TENSORANT_BASE_MODEL": "tensorant/smoke-tiny",
        "TENSORANT_DATA_DIR": str(tmp_path / "data"),
        "TENSORANT_HEARTBEAT_INTERVAL_S": "0.2",
        "TENSORANT_DATASET_URL": f"{api.url}/bucket/datasets/d1.jsonl{signature}",
        "TENSORANT_ADAPTER_UPLOAD_URL": f"{api.url}/bucket/runs/run-url/adapter.zip{signature}",
        "TENSORANT_LOGS_UPLOAD_URL": f"{api.url}/bucket/runs/run-url/logs.txt{signature}",
        # The trainer says whether it can see the run token or an upload URL (it must not).
        "TENSORANT_TRAINER_COMMAND": ('echo "token=${TENSORANT_RUN_TOKEN:-absent} '
                                      'url=${TENSORANT_ADAPTER_UPLOAD_URL:-absent}"'
                                      f" && {sys.executable} -m machine.trainer.smoke"),
        "TENSORANT_SMOKE_STEPS": "2",
        "TENSORANT_SMOKE_STEP_SECONDS": "0.01",
    }
    agent = subprocess.Popen([sys.executable, "-m", "machine.agent"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    try:
        done = api.wait_complete("run-url")
        assert done["status"] == "ok", done
        stored = api.objects["/bucket/runs/run-url/adapter.zip"]
        assert hashlib.sha256(stored).hexdigest() == done["sha256"]
        assert verify_adapter(stored, base_model="tensorant/smoke-tiny", expected_sha256=done["sha256"]).ok
        assert "token=absent url=absent" in api.objects["/bucket/runs/run-url/logs.txt"].decode()
        assert agent.poll() is None  # idling after completion
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
        output = agent.stdout.read().decode() if agent.stdout else ""
        sent = json.dumps([body for _, _, body, _ in api.calls])
        for text in (output, sent, api.objects["/bucket/runs/run-url/logs.txt"].decode()):
            assert TOKEN not in text and signature not in text
    finally:
        agent.kill()
        agent.wait()


def _bootstrap(values: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(values).encode()).decode()


def test_bootstrap_is_decoded_and_laid_over_the_environment() -> None:
    env = overlay_bootstrap({"PATH": "/bin", "TENSORANT_RUN_ID": "old",
                             "TENSORANT_BOOTSTRAP": _bootstrap({"TENSORANT_RUN_ID": "r1", "X": "a\nb"}) + "\n"})
    assert env == {"PATH": "/bin", "TENSORANT_RUN_ID": "r1", "X": "a\nb"}  # its values win; it is gone itself
    assert overlay_bootstrap({"PATH": "/bin"}) == {"PATH": "/bin"}


@pytest.mark.parametrize(("raw", "problem"), [
    ("c2VjcmV0LXZhbHVl!", "not base64"),  # a character outside the alphabet
    (base64.b64encode(b"\xff" + TOKEN.encode()).decode(), "not base64 of UTF-8"),
    (base64.b64encode(b"token=" + TOKEN.encode()).decode(), "does not decode to JSON"),
    (base64.b64encode(json.dumps([TOKEN]).encode()).decode(), "JSON object, not list"),
    (base64.b64encode(json.dumps({"TENSORANT_RUN_TOKEN": TOKEN, "N": 1}).encode()).decode(), "N are not"),
])
def test_a_malformed_bootstrap_is_refused_without_echoing_it(raw: str, problem: str) -> None:
    with pytest.raises(BootstrapError, match=problem) as caught:
        overlay_bootstrap({"TENSORANT_BOOTSTRAP": raw})
    assert TOKEN not in str(caught.value) and raw not in str(caught.value)


def test_the_agent_process_exits_on_a_malformed_bootstrap(tmp_path: Path) -> None:
    raw = base64.b64encode(("not json " + TOKEN).encode()).decode()
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
           "TENSORANT_BOOTSTRAP": raw, "TENSORANT_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run([sys.executable, "-m", "machine.agent"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 2
    assert "TENSORANT_BOOTSTRAP does not decode to JSON" in result.stderr
    assert TOKEN not in result.stdout + result.stderr and raw not in result.stdout + result.stderr
    assert not (tmp_path / "data").exists()  # refused before doing anything


def test_progress_is_read_from_the_line_start_with_other_fields_after_it(tmp_path: Path) -> None:
    config = AgentConfig(run_id="r", api_url="http://127.0.0.1:9", token=TOKEN, base_model="m",
                         data_dir=tmp_path, trainer_command="true")
    agent = Agent(config, environ={})
    try:
        lines = [b"progress=0.25 step=3 loss=1.2000 lr=0.0002\n"]
        agent._read_output(io.BytesIO(b"".join(lines)))
        assert agent.progress == 0.25
        # Not a progress line: the key is not at the start, or the value is not a number on its own.
        agent._read_output(io.BytesIO(b"eval: progress=0.9\nprogress=0.9x step=4\nprogressive=1\n"))
        assert agent.progress == 0.25
        agent._read_output(io.BytesIO(b"progress=1e0\r\n"))
        assert agent.progress == 1.0
    finally:
        agent.logs_file.close()


def test_bootstrapped_agent_forwards_the_trainer_contract_and_masks_hf_token(
        tmp_path: Path, api: FakeAgentApi) -> None:
    """The cloud machine's shape: one TENSORANT_BOOTSTRAP variable and nothing else of the run."""
    hf_token = "hf_" + "Zq9" * 12
    storage = tmp_path / "storage"
    (storage / "datasets").mkdir(parents=True)
    (storage / "datasets" / "d1.jsonl").write_text('{"text": "a"}\n')
    training = json.dumps({"lora_r": 8, "kind": "trial"})
    bootstrap = {
        "TENSORANT_RUN_ID": "run-boot",
        "TENSORANT_API_URL": api.url,
        "TENSORANT_RUN_TOKEN": TOKEN,
        "TENSORANT_BASE_MODEL": "tensorant/smoke-tiny",
        "TENSORANT_BASE_MODEL_PATH": str(tmp_path / "models" / "smoke"),
        "TENSORANT_BASE_MODEL_REVISION": "ab" * 20,  # a Hub model's pinned commit
        "TENSORANT_TRAINING": training,
        "HF_TOKEN": hf_token,
        "TENSORANT_DATA_DIR": str(tmp_path / "data"),
        "TENSORANT_STORAGE_DIR": str(storage),
        "TENSORANT_DATASET_KEY": "datasets/d1.jsonl",
        "TENSORANT_ADAPTER_KEY": "runs/run-boot/adapter.zip",
        "TENSORANT_LOGS_KEY": "runs/run-boot/logs.txt",
        "TENSORANT_TRAINER_COMMAND": (
            'echo "hf=$HF_TOKEN training=$TENSORANT_TRAINING path=$TENSORANT_BASE_MODEL_PATH '
            'revision=$TENSORANT_BASE_MODEL_REVISION boot=${TENSORANT_BOOTSTRAP:-absent} token=${TENSORANT_RUN_TOKEN:-absent}"'
            ' && echo "progress=0.5 step=1 loss=1.5000 lr=0.0002"'
            f" && {sys.executable} -m machine.trainer.smoke"),
        "TENSORANT_SMOKE_STEPS": "2",
        "TENSORANT_SMOKE_STEP_SECONDS": "0.01",
    }
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
           "TENSORANT_BOOTSTRAP": _bootstrap(bootstrap)}
    agent = subprocess.Popen([sys.executable, "-m", "machine.agent"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    try:
        done = api.wait_complete("run-boot")
        assert done["status"] == "ok", done
        lines = [line for body in api.of("run-boot", "heartbeat") for line in body["logs"]]
        assert (f"hf=*** training={training} path={tmp_path / 'models' / 'smoke'} revision={'ab' * 20} "
                "boot=absent token=absent" in lines), lines
        assert "progress=0.5 step=1 loss=1.5000 lr=0.0002" in lines
        uploaded = (storage / "runs" / "run-boot" / "logs.txt").read_text()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
        output = agent.stdout.read().decode() if agent.stdout else ""
        sent = json.dumps([body for _, _, body, _ in api.calls])
        for text in (output, sent, uploaded):
            assert hf_token not in text and TOKEN not in text, text
    finally:
        agent.kill()
        agent.wait()


# ---------------------------------------------------------------- restarts, stop, failures, tokens

REPO = str(Path(__file__).resolve().parent.parent)
SMOKE = f"{sys.executable} -m machine.trainer.smoke"


def in_process_agent(tmp_path: Path, api: FakeAgentApi, run_id: str, trainer_command: str,
                     **extra: Any) -> Agent:
    """An agent on a directory storage (a mounted volume), as the local provider gives it."""
    storage = tmp_path / "storage"
    (storage / "datasets").mkdir(parents=True, exist_ok=True)
    (storage / "datasets" / "d1.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    fields: dict[str, Any] = {
        "run_id": run_id, "api_url": api.url, "token": TOKEN, "base_model": "tensorant/smoke-tiny",
        "data_dir": tmp_path / "data", "trainer_command": trainer_command, "heartbeat_interval_s": 0.05,
        "storage_dir": str(storage), "dataset_key": "datasets/d1.jsonl", "adapter_key": f"runs/{run_id}/adapter.zip",
        "logs_key": f"runs/{run_id}/logs.txt", "complete_retry_s": 5.0, "heartbeat_retry_s": 1.0, **extra}
    environ = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": REPO, "TENSORANT_SMOKE_STEPS": "2",
               "TENSORANT_SMOKE_STEP_SECONDS": "0.01", "TENSORANT_STOP_GRACE_S": "0.5"}
    return Agent(AgentConfig(**fields), environ=environ)


class WatchedStop(threading.Event):
    """The agent's stop event, counting the waits on it: a timed wait is one round of a loop that may
    send a heartbeat; an untimed one is the agent idling until the machine stops. A test waits for
    these instead of sleeping to show that nothing more is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds = 0
        self.idling = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            self.idling.set()
        else:
            self.rounds += 1
        return super().wait(timeout)

    def rounds_pass(self, n: int, timeout: float = 10.0) -> None:
        """Return once n more timed waits have begun: the loops have had n chances to send."""
        target = self.rounds + n
        wait_until(lambda: self.rounds >= target, timeout)


class Running:
    """agent.run() on a thread; stop() ends its idling as SIGTERM would."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.watched = agent.stop = WatchedStop()
        self.code: list[int] = []
        self.thread = threading.Thread(target=lambda: self.code.append(agent.run()), daemon=True)
        self.thread.start()

    def stop(self) -> int:
        self.agent.stop.set()
        self.thread.join(timeout=30)
        self.agent.logs_file.close()
        assert self.code, "the agent did not return"
        return self.code[0]


def state_of(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / "data" / "agent-state.json").read_text())
    return data


def test_stop_in_a_heartbeat_reply_stops_the_trainer_and_a_restart_never_trains_again(
        tmp_path: Path, api: FakeAgentApi) -> None:
    # The trainer writes a checkpoint, then ignores SIGTERM: the agent must SIGKILL it after the grace.
    trainer = ('echo partial > "$TENSORANT_OUTPUT_DIR/checkpoint-1.txt" && '
               f'{sys.executable} -c "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
               "print('trainer pid', os.getpid(), flush=True); time.sleep(120)\"")
    running = Running(in_process_agent(tmp_path, api, "run-stop", trainer))
    agent = running.agent
    line = wait_until(lambda: next((x for x in list(agent.tail) if x.startswith("trainer pid")), None))
    pid = int(line.split()[-1])
    api.replies["heartbeat"] = [{"state": "retaining", "stop": True}]
    t0 = time.monotonic()
    wait_until(lambda: state_of(tmp_path).get("stopped"), timeout=15)
    assert time.monotonic() - t0 < 10
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or
               Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX")
    state = state_of(tmp_path)
    assert state["phase"] == "training" and "control plane said stop" in state["stop_reason"]
    assert running.thread.is_alive()  # idles: the machine is the control plane's to stop
    assert api.of("run-stop", "complete") == []
    assert running.watched.idling.wait(timeout=10)
    calls = len(api.calls)
    running.watched.rounds_pass(3)  # the heartbeat loop goes on, halted: three chances to send
    assert len(api.calls) == calls  # no heartbeats once stopped
    assert running.stop() == 0
    checkpoint = tmp_path / "data" / "adapter" / "checkpoint-1.txt"
    assert checkpoint.read_text() == "partial\n"

    # A RunPod resume / VM restart: the same disk, a new agent. It neither trains nor wipes.
    again = Running(in_process_agent(tmp_path, api, "run-stop", "touch ran-again"))
    assert again.watched.idling.wait(timeout=10)  # settled: it idles until the machine stops
    assert again.thread.is_alive() and len(api.calls) == calls
    assert not (tmp_path / "data" / "ran-again").exists() and checkpoint.exists()
    assert again.stop() == 0


def test_a_restart_after_the_trainer_finished_exports_without_training_again(
        tmp_path: Path, api: FakeAgentApi) -> None:
    from tests.support.adapters import build_adapter_zip

    output = tmp_path / "data" / "adapter"
    output.mkdir(parents=True)
    import zipfile

    with zipfile.ZipFile(io.BytesIO(build_adapter_zip("tensorant/smoke-tiny"))) as zf:
        zf.extractall(output)
    (tmp_path / "data" / "agent-state.json").write_text(json.dumps(
        {"run_id": "run-resume", "phase": "trained", "trainer_exit": 0}))
    running = Running(in_process_agent(tmp_path, api, "run-resume", "exit 9"))  # would fail if run
    done = api.wait_complete("run-resume")
    assert done["status"] == "ok", done
    stored = (tmp_path / "storage" / "runs" / "run-resume" / "adapter.zip").read_bytes()
    assert done["sha256"] == hashlib.sha256(stored).hexdigest()
    assert verify_adapter(stored, base_model="tensorant/smoke-tiny", expected_sha256=done["sha256"]).ok
    assert "training" not in [b["phase"] for b in api.of("run-resume", "heartbeat")]
    wait_until(lambda: state_of(tmp_path).get("completion_sent"))
    assert state_of(tmp_path)["adapter_sha256"] == done["sha256"]
    assert running.stop() == 0


def test_a_restart_mid_training_reports_and_keeps_the_output(tmp_path: Path, api: FakeAgentApi) -> None:
    output = tmp_path / "data" / "adapter"
    output.mkdir(parents=True)
    (output / "partial.bin").write_bytes(b"x" * 10)
    (tmp_path / "data" / "agent-state.json").write_text(json.dumps({"run_id": "run-mid", "phase": "training"}))
    running = Running(in_process_agent(tmp_path, api, "run-mid", "touch ran-again"))
    done = api.wait_complete("run-mid")
    assert done["status"] == "failed" and done["output_exists"] is True
    assert "restarted while the trainer was running" in done["reason"]
    assert (output / "partial.bin").exists() and not (tmp_path / "data" / "ran-again").exists()
    assert running.stop() == 0

    # A completion recorded but never sent (the agent died while reporting) is sent on restart.
    api.calls.clear()
    (tmp_path / "data" / "agent-state.json").write_text(json.dumps(
        {"run_id": "run-mid", "phase": "exported", "completion": {"status": "failed", "reason": "x"}}))
    again = Running(in_process_agent(tmp_path, api, "run-mid", "touch ran-again"))
    assert api.wait_complete("run-mid") == {"status": "failed", "reason": "x"}
    assert api.of("run-mid", "heartbeat") == []
    assert again.stop() == 0


def test_a_trainer_failing_before_any_output_says_so_with_its_last_lines(tmp_path: Path, api: FakeAgentApi) -> None:
    trainer = 'echo "loading model" && echo "RuntimeError: CUDA out of memory" >&2 && exit 3'
    running = Running(in_process_agent(tmp_path, api, "run-oom", trainer))
    done = api.wait_complete("run-oom")
    assert done["status"] == "failed" and done["exit_code"] == 3 and done["output_exists"] is False
    assert done["last_lines"] == ["loading model", "RuntimeError: CUDA out of memory"]
    assert running.stop() == 0


def test_a_renewed_token_from_a_heartbeat_reply_is_used_and_kept(tmp_path: Path, api: FakeAgentApi) -> None:
    renewed = "renewed-token-" + "Q7" * 10
    api.replies["heartbeat"] = [{"state": "preparing", "stop": False, "token": renewed}, {"stop": False}]
    running = Running(in_process_agent(tmp_path, api, "run-tok", SMOKE))
    api.wait_complete("run-tok")
    auths = [auth for run, _, _, auth in api.calls if run == "run-tok"]
    assert auths[0] == f"Bearer {TOKEN}" and set(auths[1:]) == {f"Bearer {renewed}"}
    state_file = tmp_path / "data" / "agent-state.json"
    assert state_of(tmp_path)["token"] == renewed and state_file.stat().st_mode & 0o077 == 0
    assert running.stop() == 0
    assert renewed not in (tmp_path / "data" / "logs.txt").read_text()


def test_archive_path_follows_the_docs_for_runpod_network_storage_on_a_cloud_host(
        tmp_path: Path, api: FakeAgentApi) -> None:
    """RunPod volume storage from an AWS/Azure host: presigned URLs plus the volume's keys."""
    signature = "?X-Amz-Signature=" + "ab" * 16
    api.objects["/vol/datasets/d1.jsonl"] = b'{"text": "a"}\n'
    urls = {"storage_dir": "", "dataset_url": f"{api.url}/vol/datasets/d1.jsonl{signature}",
            "adapter_upload_url": f"{api.url}/vol/runs/run-vol/adapter.zip{signature}",
            "logs_upload_url": f"{api.url}/vol/runs/run-vol/logs.txt{signature}"}
    running = Running(in_process_agent(tmp_path, api, "run-vol", SMOKE, **urls))
    assert api.wait_complete("run-vol")["status"] == "ok"
    kept = tmp_path / "data" / "runs" / "run-vol" / "adapter.zip"
    assert kept.read_bytes() == api.objects["/vol/runs/run-vol/adapter.zip"]
    assert not (tmp_path / "data" / "adapter.zip").exists()
    assert running.stop() == 0
    # Custom S3 (no volume keys) and a mounted directory keep DATA_DIR/adapter.zip.
    s3 = in_process_agent(tmp_path / "s3", api, "run-s3", SMOKE, **{**urls, "adapter_key": ""})
    mounted = in_process_agent(tmp_path / "dir", api, "run-dir", SMOKE)
    try:
        assert s3.archive_path() == tmp_path / "s3" / "data" / "adapter.zip"
        assert mounted.archive_path() == tmp_path / "dir" / "data" / "adapter.zip"
    finally:
        s3.logs_file.close()
        mounted.logs_file.close()


def test_as_root_the_trainer_runs_as_the_trainer_user(tmp_path: Path, api: FakeAgentApi) -> None:
    import pwd as pwd_module

    from machine.agent.state import Failed

    agent = in_process_agent(tmp_path, api, "run-user", SMOKE)
    agent.environ["TENSORANT_TRAINER_USER"] = "trainer"
    chowned: list[tuple[Path, int, int]] = []
    agent.chown = lambda path, uid, gid: chowned.append((path, uid, gid))
    agent.getpwnam = lambda name: pwd_module.struct_passwd(
        (name, "x", 10001, 10002, "", "/home/trainer", "/bin/sh"))
    dataset, output = tmp_path / "data" / "dataset.jsonl", tmp_path / "data" / "adapter"
    dataset.write_text("{}\n")
    output.mkdir()
    try:
        agent.geteuid = lambda: 0
        kwargs = agent.trainer_popen_kwargs(dataset, output)
        assert (kwargs["user"], kwargs["group"], kwargs["extra_groups"]) == (10001, 10002, [])
        assert kwargs["env"]["HOME"] == "/home/trainer" and kwargs["env"]["USER"] == "trainer"
        assert "TENSORANT_RUN_TOKEN" not in kwargs["env"]
        # The checkpoint folder too: the trainer writes checkpoints into it.
        checkpoints = tmp_path / "data" / "checkpoint"
        assert chowned == [(output, 10001, 10002), (checkpoints, 10001, 10002)]
        # The Hugging Face cache on the data disk (the image's HF_HOME) is made and given to the trainer.
        cache = tmp_path / "data" / "cache" / "huggingface"
        agent.environ["HF_HOME"] = str(cache)
        chowned.clear()
        kwargs = agent.trainer_popen_kwargs(dataset, output)
        assert cache.is_dir() and chowned == [(output, 10001, 10002), (checkpoints, 10001, 10002),
                                              (cache, 10001, 10002)]
        assert kwargs["env"]["HF_HOME"] == str(cache)
        # Not root: no switch possible (and none attempted).
        agent.geteuid = lambda: 1000
        kwargs = agent.trainer_popen_kwargs(dataset, output)
        assert "user" not in kwargs and "group" not in kwargs and len(chowned) == 3
        # Root without the variable: as before.
        agent.geteuid = lambda: 0
        del agent.environ["TENSORANT_TRAINER_USER"]
        assert "user" not in agent.trainer_popen_kwargs(dataset, output)
        agent.environ["TENSORANT_TRAINER_USER"] = "nobody-here"

        def unknown(name: str) -> Any:
            raise KeyError(name)

        agent.getpwnam = unknown
        with pytest.raises(Failed, match="is not a user on this machine"):
            agent.trainer_popen_kwargs(dataset, output)
    finally:
        agent.logs_file.close()


def test_a_secret_straddling_the_line_cut_is_redacted_whole(tmp_path: Path, api: FakeAgentApi) -> None:
    from machine.agent.heartbeat import MAX_LINE_CHARS

    agent = in_process_agent(tmp_path, api, "run-cut", SMOKE)
    try:
        secret = agent.config.token  # registered by the agent as a secret
        line = "x" * (MAX_LINE_CHARS - 10) + secret
        agent._record(line)
        [kept] = agent.pending
        assert secret[:10] not in kept and len(kept) <= MAX_LINE_CHARS
    finally:
        agent.logs_file.close()


def test_export_opens_only_regular_files_never_links(tmp_path: Path) -> None:
    from machine.agent.uploads import open_regular

    secret = tmp_path / "agent-state.json"
    secret.write_text('{"token": "run-token"}')
    out = tmp_path / "adapter"
    out.mkdir()
    (out / "weights.bin").write_bytes(b"w")
    (out / "link").symlink_to(secret)
    os.link(secret, out / "hard")
    os.mkfifo(out / "fifo")
    (out / "sub").mkdir()
    folder = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        regular = open_regular("weights.bin", folder)
        assert regular is not None and regular.read() == b"w"
        regular.close()
        for name in ("link", "hard", "fifo", "missing", "sub", "../agent-state.json", ".."):
            assert open_regular(name, folder) is None, name
    finally:
        os.close(folder)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _daemon_pid(agent: Agent) -> int:
    return int(next(line for line in agent.tail if line.startswith("daemon ")).split()[1])


def test_what_the_trainer_leaves_running_is_killed_before_the_export(tmp_path: Path, api: FakeAgentApi) -> None:
    # A child that stays in the trainer's session after it exits: it could swap files while the agent zips them.
    trainer = f'sleep 300 </dev/null >/dev/null 2>&1 & echo "daemon $!"; {SMOKE}'
    agent = in_process_agent(tmp_path, api, "run-daemon", trainer)
    pid = 0
    try:
        agent.train(agent.uploads.fetch_dataset())
        pid = _daemon_pid(agent)
        assert not _running(pid)
    finally:
        if pid and _running(pid):
            os.kill(pid, signal.SIGKILL)
        agent.logs_file.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the trainer as another user: needs root")
def test_a_daemon_of_the_trainer_user_in_a_session_of_its_own_is_killed(tmp_path: Path, api: FakeAgentApi) -> None:
    import pwd as pwd_module

    from machine.agent.state import Failed

    # A uid no other process on this machine has, so kill(-1) as it touches only the test's processes.
    uid = 60000 + secrets.randbelow(5000)
    trainer = 'setsid sleep 300 </dev/null >/dev/null 2>&1 & echo "daemon $!"; exit 3'
    agent = in_process_agent(tmp_path, api, "run-setsid", trainer)
    agent.environ["TENSORANT_TRAINER_USER"] = "tensorant-trainer"
    agent.getpwnam = lambda name: pwd_module.struct_passwd((name, "x", uid, uid, "", "/", "/bin/sh"))
    pid = 0
    try:
        with pytest.raises(Failed, match="exited with code 3"):
            agent.train(agent.uploads.fetch_dataset())
        pid = _daemon_pid(agent)
        assert not _running(pid)
    finally:
        if pid and _running(pid):
            os.kill(pid, signal.SIGKILL)
        agent.logs_file.close()


def test_a_failed_adapter_upload_is_reported_as_such(tmp_path: Path, api: FakeAgentApi) -> None:
    # The storage refuses the adapter's key (outside the volume): the trainer succeeded, the upload did not.
    running = Running(in_process_agent(tmp_path, api, "run-up", SMOKE, adapter_key="../../outside/adapter.zip"))
    done = api.wait_complete("run-up")
    assert done["status"] == "failed" and done["stage"] == "upload" and done["output_exists"] is True, done
    assert done["reason"].startswith("could not upload adapter.zip")
    assert running.stop() == 0


def test_a_dataset_that_changed_after_validation_is_refused(tmp_path: Path, api: FakeAgentApi) -> None:
    import hashlib

    data = b'{"text": "a"}\n{"text": "b"}\n'  # what in_process_agent stores
    good = Running(in_process_agent(tmp_path / "good", api, "run-ds-ok", SMOKE,
                                    dataset_sha256=hashlib.sha256(data).hexdigest()))
    assert api.wait_complete("run-ds-ok")["status"] == "ok"
    assert good.stop() == 0
    bad = Running(in_process_agent(tmp_path / "bad", api, "run-ds-bad", SMOKE, dataset_sha256="0" * 64))
    done = api.wait_complete("run-ds-bad")
    assert done["status"] == "failed" and done["stage"] == "dataset" and done["output_exists"] is False, done
    assert "not the validated one" in done["reason"]
    assert bad.stop() == 0


# ---------------------------------------------------------------- checkpoints and resume

# A trainer that writes one checkpoint as machine.trainer.lora does (a whole step-<k> folder renamed
# into place, then the line), then trains on until stopped; with TENSORANT_RESUME_FROM it finishes.
FAKE_CHECKPOINTING_TRAINER = '''
import json, os, sys, time
from pathlib import Path
from adapter_format.smoke import build_adapter_files

out, root = Path(os.environ["TENSORANT_OUTPUT_DIR"]), Path(os.environ["TENSORANT_CHECKPOINT_DIR"])
if os.environ.get("TENSORANT_RESUME_FROM"):
    print("resume_from=" + os.environ["TENSORANT_RESUME_FROM"], flush=True)
    for name, data in build_adapter_files("tensorant/smoke-tiny", seed=2).items():
        (out / name).write_bytes(data)
    print("progress=1.0 step=4", flush=True)
    sys.exit(0)
files = build_adapter_files("tensorant/smoke-tiny", seed=1)
manifest = json.loads(files["manifest.json"]) | {"checkpoint_step": 2, "steps": 4}
files["manifest.json"] = json.dumps(manifest).encode()
(root / ".partial").mkdir()
for name, data in [*files.items(), ("trainer_state.pt", b"optimizer")]:
    (root / ".partial" / name).write_bytes(data)
(root / ".partial").rename(root / "step-000002")
print("progress=0.5 step=2", flush=True)
print(f"checkpoint step=2 dir={root / 'step-000002'}", flush=True)
time.sleep(120)
'''


def test_a_checkpoint_is_uploaded_and_a_stopped_agent_resumes_from_it(tmp_path: Path, api: FakeAgentApi) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(FAKE_CHECKPOINTING_TRAINER)
    running = Running(in_process_agent(tmp_path, api, "run-ckpt", f"{sys.executable} {script}"))
    stored = tmp_path / "storage" / "runs" / "run-ckpt" / "adapter.zip"
    # Uploaded as soon as the trainer says it is complete, not when stopped: a retain may freeze or
    # kill the machine without warning.
    wait_until(stored.exists, timeout=30)
    result = verify_adapter(stored.read_bytes(), base_model="tensorant/smoke-tiny", expected_sha256=None)
    assert result.ok and result.summary["checkpoint_step"] == 2 and result.summary["steps"] == 4, result.problems
    with zipfile.ZipFile(stored) as zf:  # the optimizer state stays on the disk
        assert sorted(zf.namelist()) == ["adapter_config.json", "adapter_model.safetensors", "manifest.json"]
    assert (tmp_path / "data" / "checkpoint" / "step-000002" / "trainer_state.pt").exists()

    # Retained: the trainer stops; with a checkpoint on the disk the agent keeps asking whether to resume.
    api.replies["heartbeat"] = [{"state": "retained", "stop": True}]
    wait_until(lambda: state_of(tmp_path).get("stopped"), timeout=15)
    asked = len(api.of("run-ckpt", "heartbeat"))
    wait_until(lambda: len(api.of("run-ckpt", "heartbeat")) > asked + 2)
    assert api.of("run-ckpt", "complete") == []

    # `recover --resume` moved the run back to training: the next reply says so.
    api.replies["heartbeat"] = [{"state": "training", "stop": False, "resume": True}]
    done = api.wait_complete("run-ckpt")
    assert done["status"] == "ok", done
    assert done["sha256"] == hashlib.sha256(stored.read_bytes()).hexdigest()
    final = verify_adapter(stored.read_bytes(), base_model="tensorant/smoke-tiny", expected_sha256=done["sha256"])
    assert final.ok and "checkpoint_step" not in final.summary  # the final adapter replaced the checkpoint's
    logs = [line for b in api.of("run-ckpt", "heartbeat") for line in b["logs"]]
    checkpoint = tmp_path / "data" / "checkpoint" / "step-000002"
    assert f"resume_from={checkpoint}" in logs
    assert not state_of(tmp_path).get("stopped")
    assert running.stop() == 0


# ---------------------------------------------------------------- self-protection (machine/agent/guard.py)

def test_the_guard_stops_past_each_bound_and_an_idle_agent_only_at_the_runtime_limit() -> None:
    from machine.agent.guard import Guard

    t = [0.0]
    config = AgentConfig(run_id="r", api_url="http://x", token="t", base_model="m", data_dir=Path("/tmp"),
                         trainer_command="true", runtime_limit_s=1000, deadline_at=5000, self_stop_margin_s=100,
                         unreachable_stop_s=300, gone_grace_s=60)
    guard = Guard(config, clock=lambda: t[0], wall=lambda: t[0])
    t[0] = 299
    assert guard.reason(working=True) == ""
    t[0] = 301  # nothing got through since the start
    assert "unreachable for 301 s" in guard.reason(working=True)
    assert guard.reason(working=False) == ""  # idle: only the runtime limit bounds it
    guard.heard(True)
    guard.heard(False, 404)
    t[0] = 350
    assert guard.reason(working=True) == ""  # 404 for 49 s: within the grace (a store coming back)
    t[0] = 362
    assert "does not know this run (404/410)" in guard.reason(working=True)
    guard.heard(True)  # it knows the run again
    assert guard.reason(working=True) == ""
    t[0] = 1101
    assert "runtime limit (1000 s)" in guard.reason(working=False)
    late = Guard(config, clock=lambda: 0.0, wall=lambda: 5101.0)
    assert "deadline" in late.reason(working=False)
    assert Guard(config, resumed=True, clock=lambda: 0.0, wall=lambda: 5101.0).reason(working=False) == ""


def test_an_agent_whose_run_the_control_plane_no_longer_knows_stops_uploads_and_powers_off(
        tmp_path: Path, api: FakeAgentApi) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(FAKE_CHECKPOINTING_TRAINER)
    running = Running(in_process_agent(tmp_path, api, "run-gone", f"{sys.executable} {script}",
                                       gone_grace_s=0.5, poweroff="exit"))
    stored = tmp_path / "storage" / "runs" / "run-gone" / "adapter.zip"
    wait_until(stored.exists, timeout=30)  # a checkpoint is on the disk and its adapter in storage
    api.fail["heartbeat"] = [404] * 100_000  # the state store was lost: the run is unknown
    running.thread.join(timeout=30)
    assert running.code == [80], running.code  # POWEROFF_EXIT: the host script powers the machine off
    state = state_of(tmp_path)
    assert state["stopped"] and "does not know this run" in state["self_stopped"]
    assert (tmp_path / "storage" / "runs" / "run-gone" / "logs.txt").is_file()  # the logs were uploaded
    assert api.of("run-gone", "complete") == []  # nothing reported as done: the checkpoint is kept
    running.agent.logs_file.close()

    # Started again (the owner's `recover --resume` once the control plane is back): it asks, and resumes.
    api.fail["heartbeat"] = []
    api.replies["heartbeat"] = [{"state": "training", "stop": False, "resume": True}]
    again = Running(in_process_agent(tmp_path, api, "run-gone", f"{sys.executable} {script}"))
    done = api.wait_complete("run-gone")
    assert done["status"] == "ok", done
    assert state_of(tmp_path)["resumed"] is True
    assert again.stop() == 0


def test_an_unreachable_control_plane_stops_training_and_a_pod_stops_itself(tmp_path: Path, api: FakeAgentApi) -> None:
    from tests.providers.runpod.fake_server import FakeRunPod

    runpod = FakeRunPod(api_key="rpa_PODSCOPED0123").start()
    try:
        pod = runpod.add_pod("tensorant-d-run-unreach")
        script = tmp_path / "trainer.py"
        script.write_text(FAKE_CHECKPOINTING_TRAINER)
        agent = in_process_agent(tmp_path, api, "run-unreach", f"{sys.executable} {script}",
                                 unreachable_stop_s=1.0, poweroff="runpod")
        agent.environ.update(RUNPOD_POD_ID=pod, RUNPOD_API_KEY="rpa_PODSCOPED0123", RUNPOD_API_BASE_URL=runpod.url)
        running = Running(agent)
        wait_until((tmp_path / "storage" / "runs" / "run-unreach" / "adapter.zip").exists, timeout=30)
        api.fail["heartbeat"] = [503] * 100_000
        wait_until(lambda: runpod.pods[pod]["desiredStatus"] == "EXITED", timeout=30)
        assert "unreachable" in state_of(tmp_path)["self_stopped"]
        assert agent.trainer is not None and agent.trainer.poll() is not None  # the trainer was stopped
        assert running.stop() == 0
    finally:
        runpod.stop()


def test_a_lost_completion_is_sent_again_until_the_run_is_past_it(tmp_path: Path, api: FakeAgentApi) -> None:
    running = Running(in_process_agent(tmp_path, api, "run-lost", f"{sys.executable} -m machine.trainer.smoke"))
    api.wait_complete("run-lost")
    # Acknowledged, but the store lost the write: a heartbeat finds the run still exporting.
    api.replies["heartbeat"] = [{"state": "exporting", "stop": False}]
    wait_until(lambda: len(api.of("run-lost", "complete")) >= 2, timeout=30)
    api.replies["heartbeat"] = [{"state": "verifying", "stop": True}]
    wait_until(lambda: api.of("run-lost", "heartbeat")[-1:] and len(api.of("run-lost", "complete")) >= 2)
    running.watched.rounds_pass(5)
    sent = len(api.of("run-lost", "complete"))
    first, second = api.of("run-lost", "complete")[:2]
    assert first == second and first["status"] == "ok"
    running.watched.rounds_pass(5)
    assert len(api.of("run-lost", "complete")) == sent  # verifying: confirmed, nothing more sent
    assert running.stop() == 0


def test_a_resume_that_fails_in_the_trainer_reports_its_checkpoint_as_output(tmp_path: Path, api: FakeAgentApi) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(FAKE_CHECKPOINTING_TRAINER.replace('    print("resume_from="', '    sys.exit(7)\n    print("resume_from="'))
    running = Running(in_process_agent(tmp_path, api, "run-corrupt", f"{sys.executable} {script}"))
    wait_until((tmp_path / "storage" / "runs" / "run-corrupt" / "adapter.zip").exists, timeout=30)
    api.replies["heartbeat"] = [{"state": "retained", "stop": True}]
    wait_until(lambda: state_of(tmp_path).get("stopped"), timeout=15)
    api.replies["heartbeat"] = [{"state": "training", "stop": False, "resume": True}]
    done = api.wait_complete("run-corrupt")
    # The output folder is empty, but the checkpoint is on the disk: the run must be retained, not released.
    assert done["status"] == "failed" and done["exit_code"] == 7 and done["output_exists"] is True, done
    assert running.stop() == 0


def test_the_final_adapter_is_uploaded_before_the_trainers_samples_and_never_replaced_after_a_stop(
        tmp_path: Path, api: FakeAgentApi) -> None:
    """A runtime limit passing while the trainer generated its samples left only a checkpoint in storage: the
    final adapter, written before them, is uploaded at the trainer's line; the stop that follows (the control
    plane verifies that archive) uploads nothing over it."""
    from adapter_format.smoke import build_adapter_files

    files = build_adapter_files("tensorant/smoke-tiny")
    script = tmp_path / "trainer.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "out = pathlib.Path(os.environ['TENSORANT_OUTPUT_DIR'])\n"
        f"for name, data in {files!r}.items():\n"
        "    (out / name).write_bytes(data)\n"
        "print('progress=1.0000 step=2 loss=0.1', flush=True)\n"
        "print('trainer: final adapter written (2 of 2 steps); the final eval and samples follow', flush=True)\n"
        "time.sleep(120)  # the samples\n")
    running = Running(in_process_agent(tmp_path, api, "run-final", f"{sys.executable} {script}"))
    stored = tmp_path / "storage" / "runs" / "run-final" / "adapter.zip"
    wait_until(lambda: stored.is_file(), timeout=15)
    with zipfile.ZipFile(stored) as z:
        assert {n: z.read(n) for n in z.namelist()} == files  # the final adapter, not a checkpoint
    before = stored.read_bytes()
    assert verify_adapter(before, base_model="tensorant/smoke-tiny", expected_sha256=None).ok
    api.replies["heartbeat"] = [{"state": "verifying", "stop": True}]
    wait_until(lambda: state_of(tmp_path).get("stopped"), timeout=15)
    assert running.watched.idling.wait(timeout=10)
    assert api.of("run-final", "complete") == [] and stored.read_bytes() == before
    assert running.stop() == 0


def test_a_checkpoint_the_trainer_saves_at_the_stop_is_uploaded(tmp_path: Path, api: FakeAgentApi) -> None:
    """`cancel --keep` before the first periodic checkpoint: the trainer saves one at the SIGTERM and prints it
    as it exits; the agent reads the trainer's last lines before deciding what to upload (a race it could
    lose before), so that checkpoint reaches storage and the agent waits for a resume."""
    from adapter_format.smoke import build_adapter_files

    files = build_adapter_files("tensorant/smoke-tiny")
    files["manifest.json"] = json.dumps(json.loads(files["manifest.json"]) | {"checkpoint_step": 1, "steps": 60}).encode()
    script = tmp_path / "trainer.py"
    script.write_text(
        "import os, pathlib, signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    folder = pathlib.Path(os.environ['TENSORANT_CHECKPOINT_DIR']) / 'step-1'\n"
        "    folder.mkdir(parents=True)\n"
        f"    for name, data in {files!r}.items():\n"
        "        (folder / name).write_bytes(data)\n"
        "    print(f'checkpoint step=1 dir={folder}', flush=True)\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('progress=0.0167 step=1 loss=0.5', flush=True)\n"
        "time.sleep(120)\n")
    running = Running(in_process_agent(tmp_path, api, "run-cancel", f"{sys.executable} {script}"))
    agent = running.agent
    wait_until(lambda: any(x.startswith("progress=") for x in list(agent.tail)))
    api.replies["heartbeat"] = [{"state": "retaining", "stop": True}]
    stored = tmp_path / "storage" / "runs" / "run-cancel" / "adapter.zip"
    wait_until(lambda: stored.is_file(), timeout=15)
    with zipfile.ZipFile(stored) as z:
        assert json.loads(z.read("manifest.json"))["checkpoint_step"] == 1
    # With that checkpoint on its disk the agent waits for a resume (it does not idle as with nothing to resume).
    wait_until(lambda: any("waiting for a resume" in line for line in agent.logs_path.read_text().splitlines()))
    assert running.stop() in (0, 143)
