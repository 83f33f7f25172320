"""A forecast before launch. Its arithmetic for a known dataset and GPU, the steps as the
trainer plans them, the default runtime limit that follows it, the price warning, the view, and the
CLI's one line."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import pytest

from adapter_format.base_models import BASE_MODELS
from shared.models import DatasetVersionRecord, GpuOffer, TrainingSettings
from shared.runs import forecast
from tests.fakes import OFFER
from tests.harness import Harness

BIG = "meta-llama/Llama-3.1-8B-Instruct"
SMALL = "Qwen/Qwen2.5-0.5B-Instruct"
LOCAL = GpuOffer(provider="local", offer_id="local-smoke", gpu="none (local CPU)", gpu_memory_gb=0,
                 machine_type="local-process", region="local", compute_per_hour=0.0, disk_per_hour=0.0,
                 total_per_hour=0.0)


def dataset(rows: int, bytes_per_row: int) -> DatasetVersionRecord:
    return DatasetVersionRecord(org="o", project_id="p", id="d-1", rows=rows, sha256="0" * 64,
                                size_bytes=rows * bytes_per_row, storage_key="k", created_at=datetime.now(UTC))


# ---------------------------------------------------------------- the arithmetic


def test_forecast_of_a_known_dataset_on_an_a10() -> None:
    # 1,000 rows of 1,200 bytes: 300 tokens each. A full run at the defaults: 100 rows held out,
    # 900 / batch 4 = 225 steps, 225 x 4 x 300 = 270,000 tokens.
    got = forecast.predict(dataset(1000, 1200), TrainingSettings(kind="full"), BASE_MODELS[BIG], OFFER)
    assert (got.steps, got.tokens, got.tokens_source) == (225, 270_000, "estimated from bytes")
    # Llama-3.1-8B: N = its parameters less the untied input embeddings, 6 x N FLOPs per token
    # (LoRA with gradient checkpointing); an A10 at 125 TFLOPS bf16 and 35 % MFU.
    model = BASE_MODELS[BIG]
    n = model.param_count() - model.vocab_size * model.hidden_size
    assert 7.4e9 < n < 7.6e9
    rate = 125e12 * 0.35 / (6 * n)
    assert got.throughput_tokens_per_s == round(rate, 1) and 970 < rate < 973
    assert got.training_s == math.ceil(270_000 / rate) == 278
    # Startup: boot 2 min + image pull 2 min + 16 GB of bf16 weights at 50 MB/s.
    assert got.startup_s == 240 + math.ceil(2 * model.param_count() / 50e6) == 562
    assert got.total_s == 840
    assert got.cost == round(840 / 3600 * OFFER.total_per_hour, 4) == 0.2357
    assert "A10: 125 TFLOPS bf16 dense x 35.0% MFU" in got.basis and "1,200,000 bytes / 1,000 rows" in got.basis
    assert forecast.summary(got) == "~5 min training + 9 min start, ~$0.24 (tokens estimated from bytes)"


def test_throughput_follows_the_gpu_precision_4bit_and_model_size() -> None:
    ds, model = dataset(1000, 1200), BASE_MODELS[BIG]
    h100 = OFFER.model_copy(update={"gpu": "H100 SXM"})
    a10 = forecast.predict(ds, TrainingSettings(kind="full"), model, OFFER).throughput_tokens_per_s
    fast = forecast.predict(ds, TrainingSettings(kind="full"), model, h100).throughput_tokens_per_s
    assert fast / a10 == pytest.approx(989 * 0.40 / (125 * 0.35), rel=1e-3)
    qlora = forecast.predict(ds, TrainingSettings(kind="full", load_in_4bit=True), model, OFFER).throughput_tokens_per_s
    assert qlora == pytest.approx(a10 * forecast.QLORA_SPEED, rel=1e-3)
    fp32 = forecast.predict(ds, TrainingSettings(kind="full", precision="fp32"), model, OFFER).throughput_tokens_per_s
    assert fp32 == pytest.approx(a10 * 31.2 / 125, rel=1e-3)
    no_ckpt = forecast.predict(ds, TrainingSettings(kind="full", gradient_checkpointing=False), model, OFFER)
    assert no_ckpt.throughput_tokens_per_s == pytest.approx(a10 * 6 / 4, rel=1e-3)
    # A model under 1B gets half the MFU; a GPU not in the table gets conservative figures.
    small = forecast.predict(ds, TrainingSettings(kind="full"), BASE_MODELS[SMALL], OFFER)
    assert "17.5% MFU" in small.basis
    odd = forecast.predict(ds, TrainingSettings(kind="full"), model, OFFER.model_copy(update={"gpu": "Mystery X1"}))
    assert odd.throughput_tokens_per_s < a10 and "not in the table" in odd.basis
    # Names as the providers spell them.
    assert forecast.gpu_figures("NVIDIA A10G").name == "A10G"
    assert forecast.gpu_figures("NVIDIA L4").name == "L4" and forecast.gpu_figures("L40S").name == "L40S"
    assert forecast.gpu_figures("H100 PCIe").name == "H100 PCIe" and forecast.gpu_figures("H100 NVL").name == "H100 NVL"
    assert forecast.gpu_figures("A100 SXM").name == "A100" and forecast.gpu_figures("RTX A6000").name == "RTX A6000"


def test_local_cpu_and_tokens_capped_by_max_seq_len() -> None:
    # 8,000 bytes a row is 2,000 tokens; max_seq_len 512 cuts each example there.
    got = forecast.predict(dataset(100, 8000), TrainingSettings(kind="trial", max_steps=10, max_examples=64,
                                                             max_seq_len=512),
                        BASE_MODELS["HuggingFaceTB/SmolLM2-135M-Instruct"], LOCAL)
    assert got.tokens == 10 * 4 * 512
    model = BASE_MODELS["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert got.throughput_tokens_per_s == round(10e9 / (6 * model.param_count()), 1)  # tied: all of it counts
    assert (got.startup_s, got.cost) == (60, 0.0) and got.basis.count("local CPU") == 1


@pytest.mark.parametrize(("rows", "settings"), [
    (1000, {}), (19, {}), (20, {}), (7, {"batch_size": 2}), (5000, {"gradient_accumulation": 8, "epochs": 2.5}),
    (100, {"max_examples": 64, "max_steps": 30}), (100_000, {"eval_fraction": 0.5}), (300, {"eval_fraction": 0.0}),
    (64, {"max_steps": 500}),
])
def test_steps_are_the_trainers(rows: int, settings: dict[str, Any]) -> None:
    from machine.trainer.config import TrainerSettings
    from machine.trainer.lora import plan_steps, split

    ours = TrainingSettings(**settings)
    theirs = TrainerSettings(**{f.name: getattr(ours, f.name) for f in fields(TrainerSettings)
                                if f.name in TrainingSettings.model_fields and f.name != "kind"})
    train, _, _ = split(list(range(rows)), theirs)  # type: ignore[arg-type]  # split only counts and slices
    assert forecast.training_rows(rows, ours) == len(train)
    assert forecast.planned_steps(rows, ours) == plan_steps(len(train), theirs)


def test_runtime_limit_for_and_warnings() -> None:
    got = forecast.predict(dataset(1000, 1200), TrainingSettings(kind="full"), BASE_MODELS[BIG], OFFER)
    assert forecast.runtime_limit_for(got) == 1800  # 1.5 x 840 s = 1,260 s, rounded up to 30 min
    assert forecast.warnings(got, 2.0, 1800, "USD") == []
    # 1.02/h over 10 min allows 0.17; the forecast costs 0.24: the price warning.
    [price] = forecast.warnings(got, 1.02, 600, "USD")
    assert "costs ~0.24 USD" in price and "0.17 USD" in price and "not refused" in price
    # Within the price (10/h over 10 min allows 1.67) but longer than the limit.
    [runtime] = forecast.warnings(got, 10.0, 600, "USD")
    assert "longer than the runtime limit of 10 min" in runtime and "retained" in runtime


# ---------------------------------------------------------------- through the API


ROW_BYTES = 400  # every uploaded row: 399 bytes and its newline, so 100 tokens by the bytes


def upload(harness: Harness, rows: int) -> tuple[str, str]:
    project = harness.ok("POST", "/api/projects", json_body={"name": "forecast"})
    lines = []
    for i in range(rows):
        line = json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": ""}]})
        pad = ROW_BYTES - 1 - len(line)
        lines.append(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                              {"role": "assistant", "content": "a" * pad}]}))
    body = "".join(line + "\n" for line in lines).encode()
    assert len(body) == rows * ROW_BYTES
    ds = harness.ok("POST", f"/api/projects/{project['id']}/datasets", body=body, content_type="application/x-ndjson")
    return project["id"], ds["id"]


def create(harness: Harness, project: tuple[str, str], **fields: Any) -> dict[str, Any]:
    body = {"project_id": project[0], "dataset_version_id": project[1], "provider": "memory", "offer_id": "mem-a10",
            "base_model": BIG, "price_limit_per_hour": 10.0, **fields}
    status, got, _ = harness.call("POST", "/api/runs", token="member", json_body=body)
    assert status == 201, got
    return dict(got)


def messages(run: dict[str, Any], kind: str) -> list[str]:
    return [e["message"] for e in run["events"] if e["kind"] == kind]


def test_view_shows_the_forecast_and_a_short_one_keeps_the_default_limit(harness: Harness) -> None:
    project = upload(harness, 50)
    run = create(harness, project)
    f = run["forecast"]
    # A trial: 30 steps x 4 examples x 100 tokens.
    assert (f["steps"], f["tokens"], f["tokens_source"]) == (30, 12_000, "estimated from bytes")
    assert f["total_s"] == f["startup_s"] + f["training_s"] and f["startup_s"] == 562
    assert run["runtime_limit_s"] == 20 * 60  # 1.5 x ~9.5 min fits the trial's 20 min default
    assert harness.get_run(run["id"])["forecast"] == f  # stored on the run, shown by GET
    assert any(m.startswith("forecast: ~") and "tokens estimated from bytes" in m for m in messages(run, "audit"))
    assert not any("from the forecast" in m for m in messages(run, "audit"))
    assert run["warnings"] == []
    listed = {r["id"]: r for r in harness.ok("GET", "/api/runs", token="member")["items"]}
    assert listed[run["id"]]["forecast"] == f


def test_default_limit_follows_a_long_forecast_and_a_patch_recomputes_it(harness: Harness) -> None:
    project = upload(harness, 50)
    # 30 steps x 4 x 64 accumulated x 100 tokens = 768,000 tokens: ~13 min training + ~9 min start.
    run = create(harness, project, training={"gradient_accumulation": 64})
    f = run["forecast"]
    assert f["tokens"] == 768_000 and f["training_s"] == math.ceil(768_000 / f["throughput_tokens_per_s"]) == 791
    assert f["total_s"] == 1353
    assert run["runtime_limit_s"] == 2400  # 1.5 x 1,353 s = 2,030 s, rounded up to 40 min
    [note] = [m for m in messages(run, "audit") if "from the forecast" in m]
    assert "runtime limit set to 40 min" in note and "default of 20 min" in note
    assert run["warnings"] == []
    # The edit is checked as a create: a smaller accumulation, a new forecast, the default limit back.
    edited = harness.ok("PATCH", f"/api/runs/{run['id']}", token="member", json_body={"training": {"gradient_accumulation": 1}})
    assert edited["forecast"]["tokens"] == 12_000 and edited["runtime_limit_s"] == 1200
    assert harness.get_run(run["id"])["forecast"] == edited["forecast"]
    # A user's own limit is kept as given, and a forecast longer than it is said.
    edited = harness.ok("PATCH", f"/api/runs/{run['id']}", token="member",
                  json_body={"training": {"gradient_accumulation": 64}, "runtime_limit_s": 900})
    assert edited["runtime_limit_s"] == 900
    assert any("longer than the runtime limit of 15 min" in w for w in edited["warnings"])


def test_the_org_max_caps_the_forecast_limit(harness: Harness) -> None:
    harness.ok("PUT", "/api/org/limits", json_body={"max_runtime_limit_s": 4200})
    project = upload(harness, 50)
    # 30 steps x 4 x 200 x 100 tokens = 2.4M tokens: ~41 min training + ~9 min start; 1.5x = 80 min.
    run = create(harness, project, kind="full", training={"gradient_accumulation": 200, "max_steps": 30})
    assert forecast.runtime_limit_for(forecast.Forecast(**run["forecast"])) > 4200
    assert run["runtime_limit_s"] == 4200
    [note] = [m for m in messages(run, "audit") if "from the forecast" in m]
    assert "capped at the organization's max_runtime_limit_s of 70 min" in note


def test_a_price_limit_too_low_for_the_forecast_is_said_not_refused(harness: Harness) -> None:
    project = upload(harness, 50)
    # 1.02/h over 10 min allows 0.17; the forecast (~22 min at 1.01/h) costs ~0.38.
    run = create(harness, project, price_limit_per_hour=1.02, runtime_limit_s=600, training={"gradient_accumulation": 64})
    assert run["state"] == "draft" and run["forecast"]["cost"] == round(1353 / 3600 * 1.01, 4)
    [warning] = run["warnings"]
    assert "more than this run's limits allow it to spend" in warning and "0.17 USD" in warning
    assert warning in messages(run, "warning")


# ---------------------------------------------------------------- the CLI


FORECAST = {"training_s": 720, "startup_s": 240, "total_s": 960, "cost": 0.35, "tokens": 1_000_000,
            "tokens_source": "estimated from bytes", "steps": 300, "throughput_tokens_per_s": 1388.9, "basis": "..."}
RUN: dict[str, Any] = {
    "id": "r-1", "state": "draft", "phase": "", "progress": 0.0, "kind": "trial", "base_model": "m",
    "provider": "memory", "reason": "", "warnings": [], "resources": [], "events": [], "forecast": FORECAST,
    "offer": {"gpu": "A10", "machine_type": "m", "region": "r", "currency": "USD", "total_per_hour": 1.0},
    "estimate_per_hour": 1.0, "price_limit_per_hour": 2.0, "runtime_limit_s": 1800,
}
LINE = "forecast: ~12 min training + 4 min start, ~$0.35 (tokens estimated from bytes)"


class FakeClient:
    def __init__(self, url: str = "", token: str | None = None) -> None:
        self.url, self.token = url, token

    def get(self, path: str, **params: str) -> Any:
        return RUN

    def post(self, path: str, body: Any = None) -> Any:
        return RUN


@pytest.mark.parametrize(("argv", "indent"), [
    (["runs", "get", "r-1"], "  "),
    (["runs", "create", "--project", "p", "--dataset", "d", "--provider", "memory", "--offer", "o",
      "--base-model", "m", "--price-limit", "2"], ""),
])
def test_cli_prints_the_forecast_line(argv: list[str], indent: str, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_cli import main as cli
    from tensorant_cli.render import forecast_line

    monkeypatch.setattr(cli, "Client", FakeClient)
    assert cli.main(argv) == 0
    assert indent + LINE in capsys.readouterr().out.splitlines()
    assert forecast_line({**RUN, "forecast": {**FORECAST, "training_s": 20, "cost": 2.5}}) == (
        "forecast: ~20 s training + 4 min start, ~$2.50 (tokens estimated from bytes)")
    assert forecast_line({**RUN, "forecast": None}) is None  # a run made before forecasts


# ---------------------------------------------------------------- checked against what the trainer measured


def test_a_finished_run_records_the_forecasts_error_against_the_trainers_figures(harness: Harness) -> None:
    from tests.harness import smoke_adapter_zip

    run_id = harness.create_run("memory", "mem-a10", training={"max_steps": 6})
    predicted = harness.get_run(run_id)["forecast"]
    harness.launch(run_id)
    measured = {"train_seconds": predicted["training_s"] / 2, "tokens": predicted["tokens"] * 2, "steps": 6}
    harness.agent(run_id).train(smoke_adapter_zip(measured=measured))
    done = harness.get_run(run_id)
    assert done["state"] == "succeeded"
    check = done["forecast_check"]
    # The forecast's seconds were twice what the trainer took (100 % long); its tokens half (50 % short).
    assert (check["training_error"], check["tokens_error"], check["steps"]) == (1.0, -0.5, 6)
    assert check["throughput_tokens_per_s"] == round(measured["tokens"] / measured["train_seconds"], 1)
    said = [m for m in messages(done, "audit") if m.startswith("forecast vs measured")]
    assert len(said) == 1 and "(forecast 100% long)" in said[0] and "(forecast 50% short)" in said[0], said


def test_no_check_without_the_trainers_figures(harness: Harness) -> None:
    from tests.harness import smoke_adapter_zip

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).train(smoke_adapter_zip())  # the smoke trainer measures nothing
    done = harness.get_run(run_id)
    assert done["state"] == "succeeded" and done["forecast"] is not None and done["forecast_check"] is None


def test_a_like_runs_measured_throughput_replaces_the_table(harness: Harness) -> None:
    from tests.harness import smoke_adapter_zip

    project = harness.project_and_dataset(rows=40)
    first = harness.create_run("memory", "mem-a10", project=project, training={"max_steps": 6})
    table_rate = harness.get_run(first)["forecast"]["throughput_tokens_per_s"]
    harness.launch(first)
    # 3 tokens a second: far below the table's A10, as a slow machine would measure.
    harness.agent(first).train(smoke_adapter_zip(measured={"train_seconds": 200.0, "tokens": 600, "steps": 6}))
    assert harness.get_run(first)["state"] == "succeeded"

    like = harness.get_run(harness.create_run("memory", "mem-a10", project=project, training={"max_steps": 6}))
    assert like["forecast"]["throughput_tokens_per_s"] == 3.0 != table_rate
    assert f"measured by run {first}" in like["forecast"]["basis"]
    assert like["forecast"]["training_s"] == math.ceil(like["forecast"]["tokens"] / 3.0)
    # Other settings that change a token's cost (4-bit here) are not like: the table again.
    other = harness.get_run(harness.create_run("memory", "mem-a10", project=project,
                                   training={"max_steps": 6, "load_in_4bit": True}))
    assert "measured by run" not in other["forecast"]["basis"]


def test_a_check_of_a_few_seconds_does_not_stand_for_a_throughput(harness: Harness) -> None:
    from tests.harness import smoke_adapter_zip

    project = harness.project_and_dataset(rows=40)
    first = harness.create_run("memory", "mem-a10", project=project, training={"max_steps": 6})
    harness.launch(first)
    harness.agent(first).train(smoke_adapter_zip(measured={"train_seconds": forecast.MIN_MEASURED_S / 2, "tokens": 600}))
    assert harness.get_run(first)["forecast_check"] is not None
    second = harness.get_run(harness.create_run("memory", "mem-a10", project=project, training={"max_steps": 6}))
    assert "measured by run" not in second["forecast"]["basis"]


def test_runs_get_prints_the_forecasts_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_cli import main as cli
    from tensorant_cli.render import forecast_check_line

    checked = {**RUN, "forecast_check": {"training_s": 570.0, "tokens": 412_000, "steps": 30, "training_error": 0.26,
                                         "tokens_error": -0.03, "throughput_tokens_per_s": 722.8}}

    class Finished(FakeClient):
        def get(self, path: str, **params: str) -> Any:
            return checked

    monkeypatch.setattr(cli, "Client", Finished)
    assert cli.main(["runs", "get", "r-1"]) == 0
    line = "measured: 10 min training (forecast 26% long), 412,000 tokens (forecast 3% short)"
    assert "  " + line in capsys.readouterr().out.splitlines()
    assert forecast_check_line(checked) == line and forecast_check_line(RUN) is None  # none before verification
