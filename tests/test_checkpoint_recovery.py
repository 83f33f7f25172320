"""A recovery from a checkpoint is not a completed adapter (issue 29.11): the checkpoint's adapter ends a
run only when the owner accepts it at the recovery, and the run says so wherever it is shown (the run
view, the CLI's verdict and status lines, usage)."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import pytest

from adapter_format.smoke import build_adapter_files
from tensorant_cli.render import adapter_line, status_block, status_line
from tests.fake_api import FakeApi, run_cli
from tests.fakes import Cloud
from tests.harness import SMOKE_MODEL, Harness, smoke_adapter_zip


def checkpoint_zip(step: int = 20, steps: int = 100_000) -> bytes:
    """The adapter of the checkpoint at `step` of `steps`, as the agent uploads it (its manifest says so)."""
    files = build_adapter_files(SMOKE_MODEL)
    files["manifest.json"] = json.dumps(json.loads(files["manifest.json"]) | {
        "checkpoint_step": step, "steps": steps}).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def _retained_with_checkpoint(harness: Harness) -> str:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.0002)
    agent.upload(checkpoint_zip())  # the agent uploads each checkpoint's adapter as it is made
    agent.complete_failed("the runtime limit stopped the trainer")
    assert harness.get_run(run_id)["state"] == "retained"
    return run_id


def test_verify_saved_refuses_a_checkpoint_unless_accepted(harness: Harness, cloud: Cloud) -> None:
    run_id = _retained_with_checkpoint(harness)
    run = harness.recover(run_id)  # verify_saved
    # Before: succeeded at 0.0 %, as if training had completed.
    assert run["state"] == "retained", run
    assert "the checkpoint at step 20 of 100000" in run["reason"] and "not a completed adapter" in run["reason"]
    assert "recover mode resume" in run["reason"] and "accept_checkpoint: true" in run["reason"]
    assert run["adapter_kind"] is None
    [m] = cloud.machines.values()
    assert m.state == "stopped" and m.disk_exists  # nothing released

    harness.ok("POST", f"/api/runs/{run_id}/recover", json_body={"mode": "verify_saved", "accept_checkpoint": True})
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded", run
    assert (run["adapter_kind"], run["checkpoint_step"], run["planned_steps"]) == ("checkpoint", 20, 100_000)
    assert "accepted as the run's adapter" in run["reason"] and "step 20 of 100000" in run["reason"]
    usage = harness.ok("GET", "/api/usage")
    assert usage["total"]["checkpoint_adapters"] == 1 and usage["providers"][0]["checkpoint_adapters"] == 1


def test_an_uploaded_checkpoint_needs_the_query_flag(harness: Harness, cloud: Cloud) -> None:
    run_id = _retained_with_checkpoint(harness)
    run = harness.recover(run_id, upload=checkpoint_zip(step=40))
    assert run["state"] == "retained" and "step 40 of 100000" in run["reason"], run
    status, body, _ = harness.call("POST", f"/api/runs/{run_id}/recover", body=checkpoint_zip(),
                             content_type="application/zip", params={"accept_checkpoint": "maybe"})
    assert status == 422 and "accept_checkpoint" in str(body), body
    harness.ok("POST", f"/api/runs/{run_id}/recover", body=checkpoint_zip(step=40), content_type="application/zip",
         params={"accept_checkpoint": "true"})
    harness.drain()
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded" and run["checkpoint_step"] == 40, run


def test_a_final_adapter_needs_no_acceptance_and_says_final(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).train(smoke_adapter_zip())
    run = harness.get_run(run_id)
    assert run["state"] == "succeeded" and run["adapter_kind"] == "final" and run["checkpoint_step"] is None
    assert harness.ok("GET", "/api/usage")["total"]["checkpoint_adapters"] == 0


def test_a_completion_with_a_checkpoints_archive_is_retained_not_succeeded(harness: Harness, cloud: Cloud) -> None:
    # The agent said "ok" but the archive is a checkpoint's: nobody accepted it, so the disk is kept.
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).complete_ok(checkpoint_zip())
    run = harness.get_run(run_id)
    assert run["state"] == "retained" and "not a completed adapter" in run["reason"], run


# ---------------------------------------------------------------- the CLI

ACCEPTED = {"id": "r-1", "state": "succeeded", "progress": 0.0002, "provider": "memory", "reason": "adapter verified",
            "adapter_kind": "checkpoint", "checkpoint_step": 20, "planned_steps": 100_000,
            "offer": {"currency": "USD", "total_per_hour": 1.0}, "events": []}


def test_the_cli_says_a_checkpoint_everywhere_it_shows_the_run() -> None:
    line = adapter_line(ACCEPTED)
    assert line is not None and "step 20 of 100,000 (0.02% of the planned steps)" in line
    assert "not a completed adapter" in line
    assert any("checkpoint at step 20" in x for x in status_block(ACCEPTED))
    assert "adapter=checkpoint@20/100000" in status_line(ACCEPTED)
    assert adapter_line({**ACCEPTED, "adapter_kind": "final"}) is None


@pytest.mark.parametrize("flags, sent", [(["--verify-saved"], {"mode": "verify_saved"}),
                                         (["--verify-saved", "--accept-checkpoint"],
                                          {"mode": "verify_saved", "accept_checkpoint": True})])
def test_recover_sends_the_choice_and_its_verdict_names_the_checkpoint(
        fake_api: FakeApi, capsys: pytest.CaptureFixture[str], flags: list[str], sent: dict[str, Any]) -> None:
    before = {**ACCEPTED, "state": "retained", "adapter_kind": None, "events": []}
    after = {**ACCEPTED, "events": [{"at": "2026-01-01T00:00:09Z", "kind": "transition",
                                     "message": "releasing -> succeeded"}]}
    fake_api.on("GET", "/api/runs/r-1", before, after)
    fake_api.on("POST", "/api/runs/r-1/recover", {**before, "state": "recovering"})
    rc = run_cli(fake_api, "runs", "recover", "r-1", *flags, "--interval", "0")
    assert [json.loads(r["body"]) for r in fake_api.sent("POST", "/api/runs/r-1/recover")] == [sent]
    out = capsys.readouterr().out
    assert rc == 0 and "recovery verified, with a checkpoint: the checkpoint at step 20 of 100,000" in out, out


def test_a_refused_checkpoint_says_what_to_do_in_the_clis_words(fake_api: FakeApi,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    reason = ("the archive is the checkpoint at step 20 of 100000 (training stopped before its planned steps), not a "
              "completed adapter; resume training from it (recover mode resume), or accept it as the run's adapter "
              "(recover again with accept_checkpoint: true); the machine and disk are still retained")
    before = {**ACCEPTED, "state": "retained", "adapter_kind": None, "events": []}
    after = {**before, "reason": reason, "events": [{"at": "2026-01-01T00:00:09Z", "kind": "transition",
                                                     "message": "recovering -> retained"}]}
    fake_api.on("GET", "/api/runs/r-1", before, after)
    fake_api.on("POST", "/api/runs/r-1/recover", {**before, "state": "recovering"})
    assert run_cli(fake_api, "runs", "recover", "r-1", "--verify-saved", "--interval", "0") == 1
    out = capsys.readouterr().out
    assert "`tensorant runs recover r-1 --resume`" in out and "recover again with --accept-checkpoint" in out, out
