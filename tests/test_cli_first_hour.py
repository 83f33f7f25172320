"""A newcomer's first hour: the CLI against a scripted fake of the API (tests/fake_api.py).

`runs watch` prints a run's log lines before the state change they precede and shows elapsed and
billed GPU time apart; hints name CLI flags, not API fields; a 422 is printed once; `base-models -q`
prints names only; GPU hours have one format; the quickstart uses a temporary file and the org
`make run` prints a token for.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.fake_api import FakeApi, run_cli

ROOT = Path(__file__).resolve().parents[1]


def _run(state: str, events: list[str], **extra: Any) -> dict[str, Any]:
    return {"id": "r-1", "state": state, "phase": state, "progress": 1.0, "provider": "local",
            "offer": {"gpu": "cpu", "machine_type": "local", "region": "local", "currency": "USD",
                      "total_per_hour": 0.5},
            "events": [{"at": f"2026-01-01T00:00:0{i}Z", "kind": "transition", "message": m}
                       for i, m in enumerate(events)], **extra}


WALK = ["draft -> queued", "queued -> provisioning", "provisioning -> preparing", "preparing -> training"]
END = ["training -> exporting", "exporting -> verifying", "verifying -> releasing", "releasing -> succeeded"]


def test_watch_prints_the_last_log_lines_before_the_final_state(fake_api: FakeApi,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("GET", "/api/runs/r-1", _run("training", WALK), _run("succeeded", WALK + END, elapsed_s=62,
                                                                          billed_machine_s=31, final_cost=0))
    # The log pages as the API pages them: `next` is null once the run ended and every line was read.
    fake_api.on("GET", "/api/runs/r-1/logs", {"lines": ["agent: dataset fetched"], "next": "1"},
                {"lines": ["progress=1.00 step=8 loss=0.1"], "next": "2"},
                {"lines": ["agent: adapter uploaded (10 bytes)"], "next": None},
                {"lines": [], "next": None})
    assert run_cli(fake_api, "runs", "watch", "r-1", "--interval", "0") == 0
    out = capsys.readouterr().out
    lines = out.splitlines()

    def at(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    assert at("agent: dataset fetched") < at("preparing -> training")
    # Every line the run logged comes before the state changes that followed it, each once.
    assert at("step=8") < at("training -> exporting")
    assert at("adapter uploaded") < at("releasing -> succeeded")
    assert out.count("adapter uploaded") == 1 and out.count("step=8") == 1
    assert lines[-1].startswith("run r-1 succeeded after ")


def test_watch_does_not_end_before_the_final_state_line(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    # The API writes the run's state a moment before the event that says so: a poll in between
    # sees "succeeded" without "releasing -> succeeded".
    fake_api.on("GET", "/api/runs/r-1", _run("training", WALK), _run("succeeded", [*WALK, *END[:-1]]),
                _run("succeeded", WALK + END))
    fake_api.on("GET", "/api/runs/r-1/logs", {"lines": [], "next": None})
    assert run_cli(fake_api, "runs", "watch", "r-1", "--interval", "0") == 0
    assert capsys.readouterr().out.count("releasing -> succeeded") == 1


def test_watch_and_list_show_elapsed_and_billed_gpu_time_apart(fake_api: FakeApi,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # A retained run: its machine stopped after 31 minutes, the clock has gone on for 62.
    retained = _run("retained", [*WALK, "training -> retaining", "retaining -> retained"], elapsed_s=3720,
                    billed_machine_s=1860, cost_so_far=0.26, reason="the runtime limit was reached")
    fake_api.on("GET", "/api/runs/r-1", retained)
    fake_api.on("GET", "/api/runs/r-1/logs", {"lines": [], "next": None})
    fake_api.on("GET", "/api/runs", {"items": [retained]})
    assert run_cli(fake_api, "runs", "watch", "r-1", "--interval", "0") == 1
    out = capsys.readouterr().out
    assert "elapsed 1h02m, billed GPU 31m00s" in out
    assert out.splitlines()[-1].startswith("run r-1 retained after 1h02m (billed GPU 31m00s)")
    assert run_cli(fake_api, "runs", "list") == 0
    head, row = capsys.readouterr().out.splitlines()
    assert "ELAPSED" in head and "BILLED GPU" in head
    assert row[head.index("ELAPSED"):].split()[:2] == ["1h02m", "31m00s"]


# The API's own words (shared/services/api/runs/), which the CLI translates.
BARE_CANCEL = ("the run is training and its machine may hold the only copy of its output; send discard: true "
               "(release the machine and disk, deleting any output on them) or discard: false (stop the machine "
               "and keep its disk for recovery)")
OVER_LIMIT = ("nothing was launched: the estimate is 0.5000/h, above the run's limit of 0.1000/h; "
              "raise price_limit_per_hour (PATCH the draft) or choose another offer")


def test_a_bare_cancel_names_the_flags_once(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("POST", "/api/runs/r-1/cancel", {
        "type": "about:blank", "title": "Invalid input", "status": 422, "detail": f"discard: {BARE_CANCEL}",
        "errors": [{"field": "discard", "message": BARE_CANCEL}]}, status=422, ctype="application/problem+json")
    assert run_cli(fake_api, "runs", "cancel", "r-1") == 1
    err = capsys.readouterr().err
    assert err.count("the only copy of its output") == 1, err  # the detail repeats the field error
    assert "--discard" in err and "--keep" in err and "discard: true" not in err and "discard: false" not in err


def test_launch_over_the_price_limit_says_runs_edit(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("GET", "/api/runs/r-1", {**_run("draft", []), "price_limit_per_hour": 0.1, "estimate_per_hour": 0.5,
                                         "warnings": ["the estimate 0.5000 USD/h is above the price limit 0.1000/h: "
                                                      "launch will be refused until price_limit_per_hour is raised "
                                                      "or another offer is chosen"]})
    fake_api.on("POST", "/api/runs/r-1/launch", {"title": "Conflict", "status": 409, "detail": OVER_LIMIT},
                status=409, ctype="application/problem+json")
    assert run_cli(fake_api, "runs", "launch", "r-1", "--yes") == 1
    got = capsys.readouterr()
    assert "tensorant runs edit r-1 --price-limit" in got.err, got.err
    assert "PATCH" not in got.err and "price_limit_per_hour" not in got.err
    assert "price_limit_per_hour" not in got.out and "tensorant runs edit r-1 --price-limit" in got.out


def test_a_422_with_field_errors_is_printed_once(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("PATCH", "/api/runs/r-1", {
        "title": "Invalid input", "status": 422,
        "detail": "fix these fields and send again: price_limit_per_hour: Input should be greater than 0; "
                  "training.lora_r: Input should be less than or equal to 256",
        "errors": [{"field": "price_limit_per_hour", "message": "Input should be greater than 0"},
                   {"field": "training.lora_r", "message": "Input should be less than or equal to 256"}]},
        status=422, ctype="application/problem+json")
    assert run_cli(fake_api, "runs", "edit", "r-1", "--price-limit", "0") == 1
    err = capsys.readouterr().err
    assert err.count("greater than 0") == 1 and err.count("less than or equal to 256") == 1, err
    assert "--price-limit: Input should be greater than 0" in err
    assert "--set-training lora_r: Input should be less than or equal to 256" in err


def test_base_models_q_prints_only_names(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("GET", "/api/base-models", {"models": [
        {"id": "HuggingFaceTB/SmolLM2-135M-Instruct", "architecture": "llama", "params": 134515008,
         "memory_gb": {"bf16": 2.1, "four_bit": 1.4}},
        {"id": "tensorant/smoke-tiny", "architecture": "llama", "params": 1000}], "note": "a note"})
    assert run_cli(fake_api, "base-models", "-q") == 0
    assert capsys.readouterr().out.splitlines() == ["HuggingFaceTB/SmolLM2-135M-Instruct", "tensorant/smoke-tiny"]


def test_connections_providers_says_when_the_api_document_has_none(fake_api: FakeApi,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    fake_api.on("GET", "/api/openapi.json", {"openapi": "3.1.0", "paths": {}})  # a control plane older than the list
    assert run_cli(fake_api, "connections", "providers") == 1
    got = capsys.readouterr()
    assert got.out == "" and f"the API document of {fake_api.url} lists no compute providers" in got.err

def test_gpu_hours_have_one_format(fake_api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_cli.render import gpu_hours

    fake_api.on("GET", "/api/usage", {"since": "2026-01-01T00:00:00+00:00", "providers": [
        {"provider": "aws", "runs": 2, "gpu_hours": 12.3456, "cost": 9.87654, "currency": "USD"},
        {"provider": "local", "runs": 5, "gpu_hours": 0.0083, "cost": 0.0, "currency": "USD"}],
        "total": {"runs": 7, "gpu_hours": 12.3539, "cost": 9.87654}})
    assert run_cli(fake_api, "usage") == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert [rows[p][2] for p in ("aws", "local", "total")] == [gpu_hours(12.3456), gpu_hours(0.0083),
                                                                gpu_hours(12.3539)]
    assert len({len(rows[p][2].split(".")[1]) for p in rows}) == 1  # the same decimals in every row
    assert rows["aws"][3] == "$9.88"  # money as everywhere else


def _quickstart() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- quickstart:begin -->\s*```sh\n(.*?)```\s*<!-- quickstart:end -->", text, re.S)
    assert found
    return found.group(1)


def test_the_quickstart_writes_its_dataset_to_a_temporary_file() -> None:
    block = _quickstart()
    assert "/tmp/" not in block  # a fixed path collides between users of one machine
    assert re.search(r"^DS=\$\(mktemp\b", block, re.M) and '"$DS"' in block


def test_make_run_prints_a_token_for_the_quickstart_org(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import jwt

    from shared.settings import get_settings, reset_settings
    from tensorant_cli.main import build_parser
    from tensorant_devhost.run import _banner

    orgs = re.findall(r"dev-token --org (\S+)", _quickstart())
    assert len(set(orgs)) == 1
    monkeypatch.delenv("TENSORANT_ENV", raising=False)
    reset_settings()
    try:
        _banner(object(), 7071)
        out = capsys.readouterr().out
        token = re.search(r"export TENSORANT_TOKEN=(\S+)", out)
        assert token, out
        claims = jwt.decode(token.group(1), get_settings().jwt_secret, algorithms=["HS256"],
                            audience="tensorant-api")
    finally:
        reset_settings()
    assert claims["org"] == orgs[0] and f"org {orgs[0]}" in out
    assert build_parser().parse_args(["dev-token"]).org == orgs[0]  # `tensorant dev-token` alone: the same org


def test_api_words_become_cli_words() -> None:
    from tensorant_cli.render import cli_words

    assert cli_words("an owner raises max_price_limit_per_hour under /api/org/limits", "r-1") \
        == "an owner raises max_price_limit_per_hour under /api/org/limits"  # another field: kept
    assert cli_words("runtime_limit_s: 99999 s is above the limit", "r-1") == "--runtime-limit: 99999 s is above the limit"
    assert cli_words("cancel with discard: true to release its machine", "r-1") \
        == "cancel with --discard to release its machine"
