"""The real `tensorant` CLI against the local host serving the real app on Azurite.

The local provider runs the real agent with the smoke trainer, so a run goes through every
state for real in a few seconds; the CLI is called in-process (main()) or, where a pipe or a
terminal matters, as a subprocess.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorant_cli.commands.watch import watch
from tensorant_cli.main import build_parser, main
from tests.e2e.local_host import LocalHost

pytestmark = pytest.mark.e2e


def setup_org(h: LocalHost, capsys: pytest.CaptureFixture[str], *compute_set: str) -> tuple[str, str]:
    """Storage, a local connection, a project and a dataset, all through the CLI; (project, dataset)."""
    assert h.cli(capsys, "connections", "save-storage", "--set", "kind=local")[0] == 0
    code, out, err = h.cli(capsys, "connections", "save-compute", "local", "--set", "price_per_hour=0.5",
                           *compute_set, "--wait")
    assert code == 0 and "compute:local: connected" in out, (out, err)
    assert "local-smoke" in h.cli(capsys, "catalog", "--provider", "local", "-q")[1]  # loaded with the checks
    code, project, _ = h.cli(capsys, "projects", "create", "demo", "-q")
    assert code == 0 and project.strip().startswith("p-") and "\n" not in project.strip()
    data = Path(os.environ["TENSORANT_LOCAL_ROOT"]).parent / "train.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"q{i}", "completion": "a"}) for i in range(4)) + "\n")
    code, dataset, _ = h.cli(capsys, "datasets", "upload", project.strip(), str(data), "-q")
    assert code == 0 and dataset.strip().startswith("d-")
    return project.strip(), dataset.strip()


def create_run(h: LocalHost, capsys: pytest.CaptureFixture[str], project: str, dataset: str,
               limit: str = "1") -> tuple[int, str, str]:
    return h.cli(capsys, "runs", "create", "--project", project, "--dataset", dataset, "--provider", "local",
                 "--offer", "local-smoke", "--base-model", "tensorant/smoke-tiny", "--price-limit", limit)


def test_a_run_end_to_end_with_q_last_watch_get_list_logs(local_host: LocalHost,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    h = local_host
    project, dataset = setup_org(h, capsys)
    code, out, _ = h.cli(capsys, "datasets", "list", "--json")
    assert code == 0 and [d["id"] for d in json.loads(out)["items"]] == [dataset]
    code, out, _ = create_run(h, capsys, project, dataset)
    assert code == 0 and out.startswith("created run r-")
    run_id = out.split()[2]
    code, out, err = h.cli(capsys, "runs", "launch", "--last", "--yes", "-q")
    assert (code, out.strip()) == (0, run_id), err

    code, out, _ = h.cli(capsys, "runs", "watch", "--last", "--interval", "0.2")
    assert code == 0, out
    lines = out.splitlines()
    # One line per state change with its time (HH:MM:SS), in order, each once.
    changes = [line.split("  ", 1)[1] for line in lines if line[:2].isdigit() and " -> " in line]
    walked = [c.split(":")[0] for c in changes]
    for step in ("draft -> queued", "queued -> provisioning", "provisioning -> preparing", "preparing -> training",
                 "training -> exporting", "exporting -> verifying", "verifying -> releasing",
                 "releasing -> succeeded"):
        assert walked.count(step) == 1, (step, walked)
    assert any(line.startswith("  | progress=") for line in lines)  # the trainer's log lines, streamed
    assert any("cost so far" in line and "elapsed" in line for line in lines)
    assert any("provider local" in line and "machine" in line and "region" in line for line in lines)
    assert lines[-1].startswith(f"run {run_id} succeeded after ")

    code, out, _ = h.cli(capsys, "runs", "get", "--last")
    assert code == 0
    assert "loss " in out and any(c in out for c in "▁▂▃▄▅▆▇█")  # the sparkline
    assert "final cost" in out and ": released" in out
    assert "phase" not in out.splitlines()[0]  # "succeeded", not "succeeded (exporting)"
    code, out, _ = h.cli(capsys, "runs", "get", run_id, "--json")
    run = json.loads(out)
    assert run["state"] == "succeeded" and run["released_at"] and run["final_cost"] is not None
    assert run["billed_machine_s"] > 0 and {r["state"] for r in run["resources"]} == {"released"}

    code, out, _ = h.cli(capsys, "runs", "list")
    header, row = out.splitlines()[0], out.splitlines()[1]
    for col in ("PROGRESS", "COST", "ELAPSED", "BILLED GPU", "REASON"):
        assert col in header
    assert "100%" in row and "$" in row and "0.999" not in row

    code, out, _ = h.cli(capsys, "runs", "logs", "--last", "-f", "--interval", "0.1")
    assert code == 0 and out.splitlines()[-1].startswith(f"run {run_id} succeeded")
    code, plain, _ = h.cli(capsys, "runs", "logs", "--last")
    assert out.splitlines()[:-1] == plain.splitlines()  # each line once, as without -f

    code, out, err = h.cli(capsys, "runs", "launch", run_id, "--yes")
    assert code == 1 and "nothing was launched" in err and "launched:" not in out
    code, out, _ = h.cli(capsys, "usage", "--since", "2000-01-01", "--json")
    assert json.loads(out)["total"]["runs"] == 1


def test_failing_run_watch_exits_1_and_recover_waits_for_the_verdict(local_host: LocalHost,
                                                                     capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    h = local_host
    from shared import settings

    # The trainer command is the operator's setting for every org, not a connection field; this one
    # writes output, then fails.
    monkeypatch.setenv("TENSORANT_TRAINER_COMMAND", "sh -c 'echo partial > \"$TENSORANT_OUTPUT_DIR/ckpt\"; "
                                                    "echo boom; exit 3'")
    settings.reset_settings()
    project, dataset = setup_org(h, capsys)
    create_run(h, capsys, project, dataset)
    code, out, err = h.cli(capsys, "runs", "launch", "--last", "--yes")
    assert code == 0, (out, err)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    from tensorant_cli.client import Client

    screen = Tty()
    run_id = json.loads(h.cli(capsys, "runs", "list", "--json")[1])["items"][0]["id"]
    assert watch(Client(h.url, h.token), run_id, interval=0.2, stream=screen) == 1
    text = screen.getvalue()
    assert "\033[" in text and "F\033[J" in text  # the status block is redrawn in place
    assert "retained" in text.splitlines()[-1]

    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK not a zip")
    code, out, _ = h.cli(capsys, "runs", "recover", "--last", "--upload", str(bad), "--interval", "0.2")
    assert code == 1 and out.startswith("recovery failed:") and "stays retained" in out
    from tests.harness import smoke_adapter_zip

    good = tmp_path / "adapter.zip"
    good.write_bytes(smoke_adapter_zip())
    code, out, _ = h.cli(capsys, "runs", "recover", "--last", "--upload", str(good), "--interval", "0.2")
    assert code == 0 and out.startswith("recovery verified"), out
    code, out, _ = h.cli(capsys, "runs", "watch", "--last", "--no-logs", "--interval", "0.2")
    assert code == 0 and "  | " not in out and out.splitlines()[-1].startswith(f"run {run_id} succeeded")


def test_set_is_typed_by_the_schema_and_from_file(local_host: LocalHost, capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    import requests

    from tensorant_cli.schema import coerce, compute_schema

    h = local_host
    code, out, err = h.cli(capsys, "connections", "save-compute", "local", "--set", "price_per_hour=2", "--json")
    assert code == 0, err
    assert json.loads(out)["config"]["price_per_hour"] == 2.0
    # A string field stays a string whatever it looks like (the schema says string).
    doc = requests.get(f"{h.url}/api/openapi.json", timeout=10).json()
    runpod = compute_schema(doc, "runpod")
    assert runpod is not None
    key = runpod["properties"]["api_key"]
    assert coerce(doc, key, "api_key", "false") == "false" and coerce(doc, key, "api_key", "123") == "123"
    code, _, err = h.cli(capsys, "connections", "save-compute", "local", "--set", "price_per_hour=cheap")
    assert code == 2 and "price_per_hour takes number" in err
    code, _, err = h.cli(capsys, "connections", "save-compute", "local", "--set", "gpus=2")
    assert code == 2 and "no field 'gpus'" in err and "price_per_hour" in err
    body = tmp_path / "local.json"
    body.write_text(json.dumps({"price_per_hour": 0.25}))
    code, out, _ = h.cli(capsys, "connections", "save-compute", "local", "--from-file", str(body), "--json")
    assert code == 0 and json.loads(out)["config"]["price_per_hour"] == 0.25


def test_connections_providers_lists_what_the_api_offers(local_host: LocalHost,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # The providers are the control plane's to say (its registry; production leaves out the dev-only
    # ones): the CLI keeps no list of its own, and save-compute's help points at this command.
    from shared.providers.registry import compute_names

    h = local_host
    code, out, _ = h.cli(capsys, "connections", "providers")
    assert code == 0 and out.split() == compute_names() != []
    code, out, _ = h.cli(capsys, "connections", "providers", "--json")
    assert code == 0 and json.loads(out) == compute_names()
    with pytest.raises(SystemExit):
        main(["connections", "save-compute", "--help"])
    help_text = capsys.readouterr().out
    assert "one of `tensorant connections providers`" in help_text and "runpod" not in help_text

def test_drafts_warn_edit_and_delete(local_host: LocalHost, capsys: pytest.CaptureFixture[str]) -> None:
    h = local_host
    project, dataset = setup_org(h, capsys)  # the local offer costs 0.5/h
    code, out, _ = create_run(h, capsys, project, dataset, limit="0.1")
    assert code == 0 and "warning: the estimate" in out and "above the price limit" in out
    code, _, err = h.cli(capsys, "runs", "launch", "--last", "--yes")
    assert code == 1 and "nothing was launched" in err and "now costs" not in err
    # The hint in the CLI's words (the API's own say "PATCH the draft"), with the run's id.
    run_id = json.loads(h.cli(capsys, "runs", "list", "--json")[1])["items"][0]["id"]
    assert f"tensorant runs edit {run_id} --price-limit" in err and "PATCH" not in err, err
    code, out, _ = h.cli(capsys, "runs", "edit", "--last", "--price-limit", "1", "--json")
    assert code == 0 and json.loads(out)["warnings"] == [] and json.loads(out)["price_limit_per_hour"] == 1.0
    code, out, _ = h.cli(capsys, "runs", "delete", "--last")
    assert code == 0 and out.startswith("deleted draft r-")
    code, out, _ = h.cli(capsys, "runs", "list", "-q")
    assert out.strip() == ""


def test_error_texts(local_host: LocalHost, capsys: pytest.CaptureFixture[str]) -> None:
    h = local_host
    code, _, err = h.cli(capsys, "catalog", "--provider", "no-such-cloud")
    assert code == 1 and "unknown provider 'no-such-cloud'" in err and "aws" in err and "connection is saved" not in err
    code, _, err = h.cli(capsys, "catalog", "--provider", "aws")
    assert code == 1 and "tensorant connections save-compute aws" in err and "connections/compute" not in err
    h.cli(capsys, "connections", "save-storage", "--set", "kind=local")
    code, project, _ = h.cli(capsys, "projects", "create", "demo", "-q")
    data = Path(os.environ["TENSORANT_LOCAL_ROOT"]).parent / "bad.jsonl"
    data.write_text('{"text": "ok"}\nnot json\n[1]\n')
    code, _, err = h.cli(capsys, "datasets", "upload", project.strip(), str(data))
    assert code == 1
    assert err.count("line 2") == 1 and err.count("line 3") == 1, err
    assert "line 2: line 2" not in err and "- line 2: is not valid JSON" in err


def test_catalog_into_head_prints_no_broken_pipe(local_host: LocalHost, capsys: pytest.CaptureFixture[str]) -> None:
    setup_org(local_host, capsys)
    cli = f"{sys.executable} -m tensorant_cli catalog"
    # `head -n 0` has exited before the answer comes back, so the CLI writes into a closed pipe.
    for reader in ("head -n 1", "head -n 0"):
        proc = subprocess.run(f"{cli} | {reader}", shell=True, capture_output=True, text=True,
                              env=local_host.env(), timeout=60)
        assert "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "PROVIDER" in subprocess.run(f"{cli} | head -n 1", shell=True, capture_output=True, text=True,
                                        env=local_host.env(), timeout=60).stdout


def test_every_command_has_help_with_an_example() -> None:
    def leaves(parser: Any, path: str) -> Iterator[tuple[str, Any]]:
        subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            yield path, parser
        for action in subs:
            for name, child in action.choices.items():
                yield from leaves(child, f"{path} {name}")

    found = list(leaves(build_parser(), "tensorant"))
    assert len(found) > 25
    for path, parser in found:
        text = parser.format_help()
        assert "example:" in text and "tensorant " in text.split("example:")[1], path
        if any(w in path for w in ("list", " get", "create", " show")):
            assert "--json" in text and "-q" in text, path


def test_unreachable_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", "http://127.0.0.1:9", "projects", "list"]) == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


def test_dev_token_decodes_with_org_role_and_sub(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import jwt

    from shared.settings import get_settings, reset_settings

    monkeypatch.chdir(tmp_path)  # no local.settings.json here
    monkeypatch.setenv("TENSORANT_JWT_SECRET", "a-test-secret-that-is-long-enough-0123456789")
    reset_settings()
    try:
        assert main(["dev-token", "--org", "acme", "--role", "admin", "--sub", "ann"]) == 0
        token = capsys.readouterr().out.strip()
        assert "\n" not in token
        claims = jwt.decode(token, get_settings().jwt_secret, algorithms=["HS256"], audience="tensorant-api")
        assert (claims["org"], claims["role"], claims["sub"], claims["typ"]) == ("acme", "admin", "ann", "user")
    finally:
        monkeypatch.delenv("TENSORANT_JWT_SECRET")
        reset_settings()


def test_named_compute_connections_are_saved_shown_checked_and_deleted(local_host: LocalHost,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    h = local_host
    setup_org(h, capsys)  # the default `local`
    code, out, err = h.cli(capsys, "connections", "save-compute", "local", "--name", "second",
                           "--set", "price_per_hour=0.25", "--wait")
    assert code == 0 and "compute:local/second: connected" in out, (out, err)
    code, out, err = h.cli(capsys, "connections", "save-compute", "local/third", "--set", "price_per_hour=0.75")
    assert code == 0, err
    code, out, _ = h.cli(capsys, "connections", "show", "--json")
    assert {c["name"] for c in json.loads(out)["items"]} >= {"local", "local/second", "local/third"}
    code, out, _ = h.cli(capsys, "catalog", "--connection", "local/second", "--json")
    assert code == 0 and {o["connection"] for o in json.loads(out)["items"]} == {"local/second"}
    assert h.cli(capsys, "connections", "check", "local/second", "--wait")[0] == 0
    code, out, _ = h.cli(capsys, "connections", "delete", "local/second")
    assert code == 0 and "local/second" in out
    code, out, _ = h.cli(capsys, "connections", "show", "--json")
    assert "local/second" not in {c["name"] for c in json.loads(out)["items"]}
    assert "local" in {c["name"] for c in json.loads(out)["items"]}  # the default is untouched
