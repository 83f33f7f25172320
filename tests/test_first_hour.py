"""A newcomer's first hour (issue 31.2): the dev host's banner and Ctrl-C, and the CLI's answers that
said too little or the wrong thing."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensorant_cli.main import main
from tests.fake_api import FakeApi, run_cli


def _run(state: str, events: list[str], **extra: object) -> dict[str, object]:
    return {"id": "r-1", "state": state, "phase": state, "progress": 1.0, "provider": "local",
            "offer": {"gpu": "cpu", "machine_type": "local", "region": "local", "currency": "USD",
                      "total_per_hour": 0.5},
            "events": [{"at": f"2026-01-01T00:00:0{i}Z", "kind": "transition", "message": m}
                       for i, m in enumerate(events)], **extra}


RETAINED = ["draft -> queued", "queued -> provisioning", "provisioning -> preparing", "preparing -> training",
            "training -> retaining", "retaining -> retained"]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_ctrl_c_stops_a_running_runs_agent_and_says_resume(env: dict[str, str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C on `make run` left a training run's agent and trainer running with nobody enforcing its
    runtime limit: now it is stopped as a retained machine is, and the shutdown says how to go on."""
    from tensorant_devhost import run

    machines = Path(env["TENSORANT_LOCAL_ROOT"]).resolve() / "machines"
    run_id = "r-running" + secrets.token_hex(3)
    marks = {"TENSORANT_MANAGED": "true", "TENSORANT_DEPLOYMENT_ID": env["TENSORANT_DEPLOYMENT_ID"],
             "TENSORANT_ORG": "demo", "TENSORANT_RUN_ID": run_id, "TENSORANT_LOCAL_MACHINES": str(machines)}
    # A stand-in for a training run's agent, marked as the local provider marks it, and running.
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env={**os.environ, **marks}, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while _state(agent.pid) not in "SR" and time.monotonic() < deadline:
            time.sleep(0.02)
        run.say_what_is_kept()
        out = capsys.readouterr().out
        assert _state(agent.pid) == "T", "the running agent was left running"
        line = next(x for x in out.splitlines() if run_id in x)
        assert "was running" in line and "stopped" in line and f"tensorant runs recover {run_id} --resume" in line
        # Once stopped it is what a retained run's agent is, and the hint names every recovery, --resume too.
        run.say_what_is_kept()
        out = capsys.readouterr().out
        assert "--resume|--verify-saved|--upload FILE" in out and f"runs cancel {run_id} --discard" in out
    finally:
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(10)


def test_ctrl_c_on_another_port_prints_commands_that_carry_the_url(env: dict[str, str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`make run PORT=7081`, Ctrl-C: the recovery and discard commands it printed answered `cannot reach
    http://localhost:7071`. Each now carries TENSORANT_URL (and a token for another org)."""
    from tensorant_devhost import run

    machines = Path(env["TENSORANT_LOCAL_ROOT"]).resolve() / "machines"
    run_id = "r-port" + secrets.token_hex(3)
    marks = {"TENSORANT_MANAGED": "true", "TENSORANT_DEPLOYMENT_ID": env["TENSORANT_DEPLOYMENT_ID"],
             "TENSORANT_ORG": "acme", "TENSORANT_RUN_ID": run_id, "TENSORANT_LOCAL_MACHINES": str(machines)}
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env={**os.environ, **marks}, start_new_session=True)
    try:
        os.kill(agent.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while _state(agent.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        run.say_what_is_kept(7081)
        out = capsys.readouterr().out
        commands = [line for line in out.splitlines() if f"runs recover {run_id}" in line
                    or f"runs cancel {run_id}" in line]
        assert len(commands) == 2, out
        prefix = "TENSORANT_URL=http://localhost:7081 TENSORANT_TOKEN=$(tensorant dev-token --org acme) tensorant"
        assert all(prefix in line for line in commands), commands
        # On the default port and the dev org nothing is added.
        assert run.cli_prefix("demo", 7071) == ""
    finally:
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(10)


def test_the_banner_prints_one_url_and_the_console(capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_devhost import run

    run._banner(object(), 7071)
    out = capsys.readouterr().out
    assert "Tensorant control plane: http://localhost:7071\n" in out
    assert "export TENSORANT_URL=http://localhost:7071\n" in out
    assert "Web console: http://localhost:7071/api/console" in out


def test_a_cli_url_with_api_reaches_the_same_api(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """TENSORANT_URL exported as the banner once printed it (…/api) gave `no function serves GET /api/api/runs`."""
    fake_api.on("GET", "/api/runs", {"items": [], "next": None})
    assert main(["--url", fake_api.url + "/api/", "--token", "t", "runs", "list"]) == 0
    assert [r["path"].split("?")[0] for r in fake_api.requests] == ["/api/runs"]


def test_cancelling_an_ended_run_says_so_and_fails(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("GET", "/api/runs/r-1", _run("succeeded", ["releasing -> succeeded"]))
    assert run_cli(fake_api, "runs", "cancel", "r-1") == 1
    assert "nothing to cancel: run r-1 already ended succeeded" in capsys.readouterr().err
    assert fake_api.sent("POST", "/api/runs/r-1/cancel") == []


def test_watch_and_get_say_what_to_do_with_a_retained_run(fake_api: FakeApi,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    retained = _run("retained", RETAINED, elapsed_s=60, billed_machine_s=30, reason="the runtime limit was reached")
    fake_api.on("GET", "/api/runs/r-1", retained)
    fake_api.on("GET", "/api/runs/r-1/logs", {"lines": [], "next": None})
    fake_api.on("GET", "/api/runs/r-1/metrics", {"points": []})
    assert run_cli(fake_api, "runs", "watch", "r-1", "--interval", "0") == 1
    out = capsys.readouterr().out
    assert "what to do next" in out and "tensorant runs recover r-1 --resume" in out
    assert "--verify-saved" in out and "--upload adapter.zip" in out and "runs cancel r-1 --discard" in out
    assert out.splitlines()[-1].startswith("run r-1 retained after")  # still the last line
    assert run_cli(fake_api, "runs", "get", "r-1") == 0
    assert "tensorant runs recover r-1 --resume" in capsys.readouterr().out


def test_recover_resume_follows_the_run_to_its_end(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    """`recover --resume` returned at once although the help said recover waits: it now follows the run."""
    retained = _run("retained", RETAINED)
    training = _run("training", [*RETAINED, "retained -> training"])
    done = _run("succeeded", [*RETAINED, "retained -> training", "training -> exporting", "exporting -> verifying",
                              "verifying -> releasing", "releasing -> succeeded"], elapsed_s=90, final_cost=0)
    fake_api.on("GET", "/api/runs/r-1", retained, training, done)
    fake_api.on("POST", "/api/runs/r-1/recover", training)
    fake_api.on("GET", "/api/runs/r-1/logs", {"lines": ["progress=1.00 step=8 loss=0.1"], "next": None})
    assert run_cli(fake_api, "runs", "recover", "r-1", "--resume", "--interval", "0") == 0
    out = capsys.readouterr().out
    assert "releasing -> succeeded" in out and out.splitlines()[-1].startswith("run r-1 succeeded after")


def test_readme_says_what_a_newcomer_needs() -> None:
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    # The peft snippet shows the adapter's answer next to the base model's (it only loaded the adapter).
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "PeftModel" in b)
    compile(snippet, "README snippet", "exec")
    assert "generate(" in snippet and "disable_adapter()" in snippet and "AutoTokenizer.from_pretrained" in snippet
    assert "trainer_command=false" not in readme  # no provider has that field
    for shape in ('{"messages": ', '{"prompt": "...", "completion": "..."}', '{"text": "..."}'):
        assert shape in readme  # the dataset format, documented outside an error message
    assert "/api/console" in readme and "recover <RUN_ID> --resume" in readme


def test_runs_delete_yes_discards_a_run_that_holds_a_machine(fake_api: FakeApi,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`runs delete --yes` was refused (no such flag) while `cancel --discard --yes` worked: for a run that is
    not a draft, --yes now means the discard; without it the refusal names the exact commands."""
    retained = _run("retained", RETAINED)
    fake_api.on("GET", "/api/runs/r-1", retained, retained)
    fake_api.on("POST", "/api/runs/r-1/cancel", {**retained, "state": "releasing"})
    assert run_cli(fake_api, "runs", "delete", "r-1") == 1
    err = capsys.readouterr().err
    assert "tensorant runs cancel r-1 --discard --yes" in err and "nothing was deleted" in err, err
    assert fake_api.sent("POST", "/api/runs/r-1/cancel") == [] and fake_api.sent("DELETE", "/api/runs/r-1") == []
    assert run_cli(fake_api, "runs", "delete", "r-1", "--yes") == 0
    assert [json.loads(r["body"]) for r in fake_api.sent("POST", "/api/runs/r-1/cancel")] == [{"discard": True}]
    assert "machine and disk discarded" in capsys.readouterr().out
    # A draft is deleted as before.
    fake_api.on("GET", "/api/runs/r-2", {**retained, "id": "r-2", "state": "draft"})
    fake_api.on("DELETE", "/api/runs/r-2", None, status=204)
    assert run_cli(fake_api, "runs", "delete", "r-2", "--yes") == 0
    assert len(fake_api.sent("DELETE", "/api/runs/r-2")) == 1


def test_each_long_install_step_says_it_is_still_working() -> None:
    """[1/4] and [4/4] printed nothing for minutes on a busy machine: each long step runs the Makefile's
    TICK, which prints a line every TICK_S seconds until the step ends."""
    root = Path(__file__).resolve().parent.parent
    text = (root / "Makefile").read_text()
    tick = next(line for line in text.splitlines() if line.startswith("TICK :="))[len("TICK :="):]
    for step in ("[1/4]", "[2/4]", "[4/4]"):
        recipe = text[text.index(f'@echo "{step}'):].split("\n\n", 1)[0]
        assert "$(TICK)" in recipe.split("\n", 1)[1], step
    shell = tick.replace("$(TICK_S)", "0.2").replace("$$", "$")
    out = subprocess.run(["bash", "-c", f"start=$SECONDS; {shell} sleep 0.7; echo done"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    assert out.count("still working:") >= 2 and out.rstrip().endswith("done"), out
