"""A newcomer's first hour (issue 31): errors and forecasts that say what to fix, in words a person reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from shared.errors import invalid
from shared.models import RunCreate
from tests.harness import Harness

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


def _create(**training: object) -> dict[str, object]:
    return {"project_id": "p1", "provider": "local", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "dataset_id": "d1", "training": training}


def test_an_unknown_key_names_the_nearest_valid_one_and_lists_them() -> None:
    """`lr: Extra inputs are not permitted` said nothing of what to send instead."""
    with pytest.raises(ValidationError) as caught:
        RunCreate.model_validate(_create(lr=1e-4))
    err = invalid(caught.value, model=RunCreate)
    field = next(e for e in err.errors if e["field"] == "training.lr")
    assert "did you mean learning_rate?" in field["message"]
    assert "batch_size" in field["message"] and "learning_rate" in field["message"]
    assert "Extra inputs" not in err.detail
    # A near misspelling is found by its likeness; a key of the request itself lists the request's fields.
    with pytest.raises(ValidationError) as caught:
        RunCreate.model_validate({**_create(), "base_modle": "x"})
    top = invalid(caught.value, model=RunCreate).errors
    assert any(e["field"] == "base_modle" and "did you mean base_model?" in e["message"] for e in top)


# ---------------------------------------------------------------- the local provider's base models


def _local_draft(harness: Harness, base_model: str) -> tuple[int, Any]:
    pid, dsid = harness.project_and_dataset(rows=20)
    body = {"project_id": pid, "dataset_version_id": dsid, "provider": "local", "offer_id": "local-smoke",
            "base_model": base_model, "price_limit_per_hour": 1.0}
    status, got, _ = harness.call("POST", "/api/runs", token="member", json_body=body)
    return status, got


def test_a_base_model_the_local_host_cannot_load_is_refused_at_create(
        harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2.5-0.5B was accepted on the local CPU with no hub access and failed a minute in: it is
    refused at create with what to do, and the base-models list no longer calls it trainable there."""
    monkeypatch.setenv("HOME", str(tmp_path))  # an empty Hugging Face cache
    harness.save_compute("local", {})
    status, body = _local_draft(harness, QWEN)
    assert status == 422, body
    err = body["errors"][0]
    assert err["field"] == "base_model" and "cannot be loaded on this host" in err["message"]
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in err["message"] and f"hf download {QWEN}" in err["message"]
    listed = {m["id"]: m for m in harness.ok("GET", "/api/base-models", token="member")["items"]}
    assert listed[QWEN]["local_cpu"] is False and listed["tensorant/tiny-llama"]["local_cpu"] is True
    [offer] = harness.ok("GET", "/api/catalog/gpus", params={"provider": "local", "base_model": QWEN})["items"]
    assert offer["fits"] is False and "cannot be loaded on this host" in offer["fit_note"]
    # Once in this host's cache (what `hf download` leaves) the trainer loads it without the hub: accepted.
    snapshot = tmp_path / ".cache/huggingface/hub" / f"models--{QWEN.replace('/', '--')}" / "snapshots/abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert _local_draft(harness, QWEN)[0] == 201
    # A cloud provider fetches from the hub: not refused there.
    pid, dsid = harness.project_and_dataset(rows=20)
    status, _, _ = harness.call("POST", "/api/runs", token="member", json_body={
        "project_id": pid, "dataset_version_id": dsid, "provider": "memory", "offer_id": "mem-a10",
        "base_model": "Qwen/Qwen2.5-0.5B", "price_limit_per_hour": 10.0})
    assert status == 201


def test_a_model_over_the_local_cpu_cap_says_choose_a_smaller_model_or_a_gpu(harness: Harness) -> None:
    """"lower batch_size or max_seq_len, or set load_in_4bit" cannot help an 8B model on the local CPU."""
    harness.save_compute("local", {})
    status, body = _local_draft(harness, "meta-llama/Llama-3.1-8B-Instruct")
    assert status == 422, body
    assert "too large for the local CPU provider" in body["detail"] and "GPU provider" in body["detail"]
    assert "load_in_4bit" not in body["detail"] and "batch_size" not in body["detail"]


# ---------------------------------------------------------------- a failure's reason, readable and said once

HUB_ERROR = ("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached "
             "files.\nCheck your internet connection or see how to run the library in offline mode at "
             "'https://huggingface.co/docs/transformers/installation#offline-mode'.\n" + "x" * 900)


def test_a_base_model_the_hub_cannot_serve_is_one_line_that_says_what_to_do() -> None:
    from machine.trainer.lora import Job, load_error

    job = Job(output=Path("o"), base_model=QWEN, source=QWEN, token=None, s=None, rows=None,  # type: ignore[arg-type]
              checkpoint_root=None, resume_from=None, step_sleep_s=0, threads=0)
    said = load_error(OSError(HUB_ERROR), job)
    assert "\n" not in said and len(said) < 300
    assert "hub could not be reached" in said and f"hf download {QWEN}" in said
    other = load_error(ValueError("Unrecognized model in /m.\nShould have a `model_type` key\n" + "y" * 900), job)
    assert other == "Unrecognized model in /m."


def test_the_trainers_last_line_is_not_repeated_in_the_reason() -> None:
    from shared.models import AgentComplete
    from shared.services.api.agent import _failure_reason, _last_lines

    last = f"trainer: could not load base model {QWEN!r}: the Hugging Face hub could not be reached"
    body = AgentComplete(status="failed", exit_code=3, reason=f"the trainer exited with code 3; last output: {last}",
                         last_lines=["trainer: lora kind=trial", last])
    reason = _failure_reason(body) + _last_lines(body)
    assert reason.count(last) == 1 and "trainer: lora kind=trial" in reason


def test_the_cli_prints_a_reason_line_by_line_not_as_escapes() -> None:
    from tensorant_cli.render import status_block, status_line

    run = {"id": "r-1", "state": "failed", "reason": "training failed (exit code 3): it failed; the trainer's "
                                                      "last lines:\ntrainer: one\ntrainer: two\x1b[2J"}
    block = status_block(run)
    assert not any("\\x0a" in line for line in block)
    assert block[-3:] == ["  reason: training failed (exit code 3): it failed; the trainer's last lines:",
                          "    trainer: one", "    trainer: two\\x1b[2J"]  # still no escape sequence let through
    line = status_line(run)
    assert "\\x0a" not in line and "trainer: one / trainer: two" in line


# ---------------------------------------------------------------- errors that name the CLI command


def test_missing_connections_are_answered_with_the_command_that_saves_them(env: dict[str, str], cloud: Any) -> None:
    """"an owner saves one under connections/storage" named an API path; the catalog's error named a
    local.json that does not exist (the local provider needs no file)."""
    from tests.harness import Harness

    bare = Harness()
    try:
        status, body, _ = bare.call("POST", "/api/projects", json_body={"name": "demo"})
        assert status == 409, body
        assert "`tensorant connections save-storage --set kind=local`" in body["detail"]
        assert "connections/storage" not in body["detail"]
        status, body, _ = bare.call("GET", "/api/catalog/gpus", params={"provider": "local"})
        assert status == 404, body
        assert "`tensorant connections save-compute local`" in body["detail"] and ".json" not in body["detail"]
        status, body, _ = bare.call("GET", "/api/catalog/gpus", params={"provider": "aws"})
        assert status == 404 and "--from-file aws.json` (a JSON file you write with" in body["detail"], body
    finally:
        bare.close()


# ---------------------------------------------------------------- the forecast's and the pace's words


def test_a_forecast_just_over_the_limit_is_said_to_the_second() -> None:
    """"the forecast needs ~1 min ... longer than the runtime limit of 1 min" read as no problem."""
    from shared.models import Forecast
    from shared.runs import forecast

    got = Forecast(training_s=35, startup_s=40, total_s=75, cost=0.0, tokens=1000, steps=5,
                   throughput_tokens_per_s=30.0, basis="table")
    said = forecast.warnings(got, price_limit_per_hour=10.0, runtime_limit_s=60, currency="USD")
    assert len(said) == 1 and "needs ~1 min 15 s" in said[0] and "runtime limit of 1 min:" in said[0], said
    # Far apart, minutes as before.
    assert "needs ~20 min" in forecast.warnings(got.model_copy(update={"total_s": 1200}), 10.0, 600, "USD")[0]


def test_the_pace_warning_says_seconds_never_0_min() -> None:
    """"10% of the planned steps in 0 min ... the runtime limit ends in 0 min"."""
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from shared.models import RunState
    from shared.services.api.agent import pace_warning

    t = datetime(2026, 1, 1, tzinfo=UTC)
    run = SimpleNamespace(state=RunState.training, state_changed_at=t - timedelta(seconds=8),
                          pace_from=t - timedelta(seconds=6), pace_from_progress=0.0,
                          deadlines=SimpleNamespace(runtime_by=t + timedelta(seconds=20)))
    said = pace_warning(run, 0.1, t)  # type: ignore[arg-type]
    assert "0 min" not in said
    assert "10% of the planned steps in 6 s" in said and "needs about 54 s more" in said and "ends in 20 s" in said


def _warnings(harness: Harness, run_id: str) -> list[str]:
    return [line for line in harness.ok("GET", f"/api/runs/{run_id}/logs")["lines"] if "warning" in str(line)]


def test_the_pace_clock_starts_at_the_first_training_step(harness: Harness, cloud: Any) -> None:
    """The quickstart's pace warning said "12% of the planned steps in 8 min ... needs about 60 min" when
    the 8 minutes were the one-time model conversion before the first step; the run succeeded."""
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=1800)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.0)
    harness.clock.advance(8 * 60)  # loading and converting the model: no step yet
    agent.heartbeat("training", 0.01)  # the first step
    harness.clock.advance(60)
    agent.heartbeat("training", 0.12)  # 11% in a minute: ~8 min more, well within the limit
    assert _warnings(harness, run_id) == []
    # A pace that would not finish is still said, from the first step's clock.
    harness.clock.advance(10 * 60)
    agent.heartbeat("training", 0.2)  # 19% in 11 min: ~47 min more, the limit ends in ~20 min
    said = _warnings(harness, run_id)
    assert len(said) == 1 and "19% of the planned steps in 11 min" in str(said[0]), said


# ---------------------------------------------------------------- retained runs


def test_after_stop_the_view_says_the_machine_is_stopped(harness: Harness, cloud: Any) -> None:
    """After `runs stop`, `get` still showed the machine "running (started for recovery)"."""
    from tests.test_reliability import retained_run

    run_id = retained_run(harness)
    harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "start_machine"})
    machines = [r for r in harness.get_run(run_id)["resources"] if r["kind"] in ("instance", "machine", "vm", "pod")]
    assert machines and machines[0]["state"] == "running (started for recovery)", machines
    harness.ok("POST", f"/api/runs/{run_id}/stop", token="member")
    run = harness.get_run(run_id)
    states = {r["kind"]: r["state"] for r in run["resources"]}
    assert states[machines[0]["kind"]] == "stopped", states


def test_a_local_machine_stop_is_confirmed_in_the_same_call(env: dict[str, str]) -> None:
    """On the local provider `runs stop` read /proc right after the SIGSTOP, found the agent still
    running and answered "stopping": the view kept "running (started for recovery)"."""
    import os
    import subprocess
    import sys

    from shared.providers.base import RunRef
    from shared.providers.local.compute import LocalCompute
    from shared.providers.local.config import LocalConfig
    from shared.settings import get_settings

    compute = LocalCompute(LocalConfig(), get_settings())
    ref = RunRef(deployment=compute.deployment, org="demo", run_id="r-stop" + os.urandom(3).hex())
    marks = {"TENSORANT_MANAGED": "true", "TENSORANT_DEPLOYMENT_ID": compute.deployment, "TENSORANT_ORG": "demo",
             "TENSORANT_RUN_ID": ref.run_id, "TENSORANT_LOCAL_MACHINES": str(compute.machines)}
    # A busy agent: a process that is running (R), not sleeping, when the signal comes.
    agent = subprocess.Popen([sys.executable, "-c", "while True: pass"], env={**os.environ, **marks},
                             start_new_session=True)
    try:
        import time

        deadline = time.monotonic() + 10
        while not compute._procs(ref)[0] and time.monotonic() < deadline:
            time.sleep(0.02)
        outcome = compute.retain(ref, [])
        assert outcome.done, outcome
    finally:
        agent.kill()
        agent.wait()


def test_a_refused_upload_keeps_the_original_reason_and_records_no_digest(harness: Harness, cloud: Any) -> None:
    """A rejected upload's sha256 was recorded as the run's adapter sha256, and its refusal replaced the
    reason the run was retained for."""
    import hashlib

    from shared.store import get_store

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    a = harness.agent(run_id)
    a.heartbeat("training", 0.3)
    a.complete_failed("CUDA out of memory", exit_code=137)
    first = harness.get_run(run_id)["reason"]
    assert first.startswith("training failed (exit code 137)")
    bad = b"PK not really a zip"
    for _ in range(2):  # a second refusal still says why the run was retained, once
        run = harness.recover(run_id, upload=bad)
        assert run["state"] == "retained"
        assert run["reason"].startswith(first.rstrip(". ") + ". Recovery refused: adapter verification failed")
        assert run["reason"].count("exit code 137") == 1 and run["reason"].count("Recovery refused") == 1
        assert run["adapter_sha256"] == "" and get_store().runs.get(harness.org, run_id)[0].adapter_sha256 == ""
    refused = [e for e in run["events"] if e["kind"] == "warning" and e["message"].startswith("recovery refused")]
    assert refused and refused[-1]["data"]["refused_sha256"] == hashlib.sha256(bad).hexdigest(), refused


def test_deleting_an_ended_run_says_it_stays_as_a_record_not_cancel_it(harness: Harness, cloud: Any) -> None:
    """Deleting a succeeded run advised "cancel it instead", and cancel does nothing for an ended run."""
    from tests.harness import smoke_adapter_zip

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).train(smoke_adapter_zip())
    assert harness.get_run(run_id)["state"] == "succeeded"
    status, body, _ = harness.call("DELETE", f"/api/runs/{run_id}")
    assert status == 409, body
    assert "cancel" not in body["detail"] and "stays as the record" in body["detail"], body
    # A run still going is told to cancel, with the command.
    other = harness.create_run("memory", "mem-a10")
    harness.launch(other)
    status, body, _ = harness.call("DELETE", f"/api/runs/{other}")
    assert status == 409 and f"tensorant runs cancel {other}" in body["detail"], body


def test_library_future_warnings_stay_out_of_a_runs_log() -> None:
    """Every training log carried transformers' FutureWarnings (`gradient_checkpointing_enable` is
    deprecated...), each with its source path; a warning of another kind still shows."""
    import warnings

    from machine.trainer.lora import quiet_library_warnings

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        quiet_library_warnings()
        warnings.warn_explicit("`gradient_checkpointing_enable` is deprecated", FutureWarning, "modeling_utils.py",
                               3204, module="transformers.modeling_utils")
        warnings.warn("a real one", UserWarning, stacklevel=1)
    assert [str(w.message) for w in got] == ["a real one"]


def test_a_forecast_without_a_measured_pace_says_how_far_off_it_may_be() -> None:
    """The first run on a host was forecast "~2 min training + 1 min start" and took 12 min: until a like
    run is measured the forecast says it is a table estimate, in the view's forecast and the CLI's line."""
    from datetime import UTC, datetime

    from adapter_format.base_models import BASE_MODELS
    from shared.models import DatasetVersionRecord, GpuOffer, TrainingSettings
    from shared.runs import forecast
    from tensorant_cli.render import forecast_line

    local = GpuOffer(provider="local", offer_id="local-smoke", gpu="none (local CPU)", gpu_memory_gb=0,
                     machine_type="local-process", region="local", compute_per_hour=0.0, disk_per_hour=0.0,
                     total_per_hour=0.0)
    data = DatasetVersionRecord(org="o", project_id="p", id="d-1", rows=40, sha256="0" * 64, size_bytes=40 * 400,
                                storage_key="k", created_at=datetime.now(UTC))
    model = BASE_MODELS["HuggingFaceTB/SmolLM2-135M-Instruct"]
    table = forecast.predict(data, TrainingSettings(kind="trial", max_steps=30), model, local)
    assert "no run of this model measured on this host's CPU yet" in table.uncertainty
    line = forecast_line({"offer": {"currency": "USD"}, "forecast": table.model_dump()})
    assert line is not None and "it may be several times off" in line
    measured = forecast.predict(data, TrainingSettings(kind="trial", max_steps=30), model, local,
                             forecast.Measured(run_id="r-0", tokens_per_s=50.0))
    assert measured.uncertainty == ""
    line = forecast_line({"offer": {"currency": "USD"}, "forecast": measured.model_dump()})
    assert line is not None and "several times" not in line


def test_the_agents_errors_are_sentences_not_errno_or_decode_errors() -> None:
    """Raw `[Errno 2] No such file or directory: '/long/path'` and a DecodeError in the training log."""
    import json
    import urllib.error

    from machine.agent.transport import describe_error

    missing = FileNotFoundError(2, "No such file or directory", "/srv/run/data/checkpoints/step-4/adapter.bin")
    assert describe_error(missing) == "no such file or directory (adapter.bin)"
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    assert describe_error(refused) == "connection error: connection refused"
    try:
        json.loads("<html>")
    except json.JSONDecodeError as exc:
        assert describe_error(exc) == "the answer was not JSON"
    for said in (describe_error(missing), describe_error(refused)):
        assert "Errno" not in said and "/srv" not in said


def test_watch_says_a_failures_reason_once_line_by_line(fake_api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A failed run's ~1,500-character reason (the trainer's last lines as \\x0a's) was printed three
    times: in training -> releasing, in releasing -> failed, and in the status block."""
    from tests.fake_api import run_cli

    reason = ("training failed (exit code 3): the trainer exited with code 3; last output: trainer: could not load "
              "base model; the machine and disk are released; the trainer's last lines:\ntrainer: lora kind=trial")
    moves = ["draft -> queued", "queued -> provisioning", "provisioning -> training",
             f"training -> releasing: {reason}", f"releasing -> failed: {reason}"]
    run = {"id": "r-1", "state": "failed", "phase": "failed", "progress": 0.0, "provider": "local", "reason": reason,
           "offer": {"gpu": "cpu", "machine_type": "local", "region": "local", "currency": "USD", "total_per_hour": 0},
           "events": [{"at": f"2026-01-01T00:00:0{i}Z", "kind": "transition", "message": m}
                      for i, m in enumerate(moves)]}
    fake_api.on("GET", "/api/runs/r-1", run)
    fake_api.on("GET", "/api/runs/r-1/logs", {"lines": [], "next": None})
    fake_api.on("GET", "/api/runs/r-1/metrics", {"points": []})
    assert run_cli(fake_api, "runs", "watch", "r-1", "--interval", "0") == 1
    out = capsys.readouterr().out
    assert "\\x0a" not in out
    assert out.count("could not load base model") == 2, out  # the transition's first line, the status block
    assert out.count("trainer: lora kind=trial") == 1, out  # the rest of it, once
    assert any(line.endswith("releasing -> failed") for line in out.splitlines()), out
    # `runs get`'s history and status alike.
    assert run_cli(fake_api, "runs", "get", "r-1") == 0
    out = capsys.readouterr().out
    assert "\\x0a" not in out and out.count("trainer: lora kind=trial") == 1, out


# ---------------------------------------------------------------- the runtime limit after the last step


def _finished_at_the_limit(harness: Harness, archive: bytes) -> dict[str, Any]:
    """A run whose trainer did every planned step (progress 1.0) and runs its final eval and samples when the
    runtime limit passes; `archive` is what the agent uploaded meanwhile."""
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=600)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.5)
    agent.heartbeat("training", 1.0, ["trainer: final adapter written (8 of 8 steps); the final eval and samples "
                                      "follow"])
    agent.upload(archive)
    harness.clock.advance(601)
    harness.tick("heartbeat_check")
    reply = agent.heartbeat("training", 1.0)
    assert reply["stop"] is True and reply["state"] == "verifying"  # the trainer's samples are cut
    harness.drain()
    return harness.get_run(run_id)


def test_a_training_that_finished_its_steps_is_verified_at_the_limit_not_retained(harness: Harness, cloud: Any) -> None:
    """The runtime limit passed while the trainer generated its post-training samples: the run was retained
    ("training stopped before its planned steps", false) although every step was done and its adapter written."""
    from tests.harness import smoke_adapter_zip

    run = _finished_at_the_limit(harness, smoke_adapter_zip())
    assert run["state"] == "succeeded", run["reason"]
    assert run["adapter_kind"] == "final"
    assert "runtime limit passed after the training finished all its planned steps" in run["reason"], run["reason"]
    assert "samples were cut" in run["reason"] and "before its planned steps" not in run["reason"]


def test_a_finished_training_whose_final_adapter_is_not_in_storage_is_retained_saying_so(
        harness: Harness, cloud: Any) -> None:
    """Only a checkpoint reached storage: retained, and the reason does not say training stopped short."""
    from tests.test_checkpoint_recovery import checkpoint_zip

    run = _finished_at_the_limit(harness, checkpoint_zip(step=50, steps=60))
    assert run["state"] == "retained", run["reason"]
    assert "before its planned steps" not in run["reason"], run["reason"]
    assert "the training finished all its planned steps, but its final adapter did not reach storage" \
        in run["reason"], run["reason"]


# ---------------------------------------------------------------- cancel --keep before the first checkpoint


def test_cancel_keep_gives_the_agent_time_to_checkpoint_before_the_machine_stops(harness: Harness, cloud: Any) -> None:
    """`cancel --keep` before the first checkpoint left nothing to resume from: the machine is stopped only after
    the agent has heard `stop` (its trainer saves a checkpoint of the current step, which the agent uploads)."""
    from shared.services.api.runs.actions import CANCEL_CHECKPOINT_S
    from tensorant_cli.render import next_steps
    from tests.test_checkpoint_recovery import checkpoint_zip

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.05)
    t0 = harness.clock()
    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": False})
    # The retain step (which stops the machine) is sent delayed: the agent hears `stop` first.
    assert [round(due - t0) for due in harness._due.values()] == [CANCEL_CHECKPOINT_S]
    assert harness.get_run(run_id)["state"] == "retaining"
    assert agent.heartbeat("training", 0.05)["stop"] is True
    agent.upload(checkpoint_zip(step=3, steps=60))  # the checkpoint the trainer saved at the SIGTERM
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and run["adapter_saved"] is True
    assert [m.state for m in cloud.machines.values()] == ["stopped"]
    assert "asked to save a checkpoint" in run["reason"]
    assert any("--resume" in line for line in next_steps(run))


def test_a_retained_run_with_nothing_saved_offers_only_what_works(harness: Harness, cloud: Any) -> None:
    """Nothing reached storage (a trainer that cannot checkpoint): the next steps listed --verify-saved and
    --resume, both of which then failed. They say there is nothing to recover and offer what works."""
    from tensorant_cli.render import next_steps

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.05)
    harness.ok("POST", f"/api/runs/{run_id}/cancel", json_body={"discard": False})
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and run["adapter_saved"] is False, run
    steps = "\n".join(next_steps(run))
    assert "nothing of this run's training was saved" in steps
    assert "--verify-saved" not in steps and "--resume" not in steps and "--upload" not in steps
    assert f"runs cancel {run_id} --discard" in steps and "--start-machine" in steps
    for body in ({"mode": "verify_saved"}, {"mode": "resume"}):
        status, refused, _ = harness.call("POST", f"/api/runs/{run_id}/recover", json_body=body)
        assert status == 409 and "nothing" in refused["detail"], refused
    assert harness.get_run(run_id)["state"] == "retained"
