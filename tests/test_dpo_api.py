"""Preference training (issue 43.2) at the API: pairs checked at upload (and never mixed with
examples), method dpo refused on a dataset of examples and sft on one of pairs, its settings bounded
at create, and its forecast paying for the reference model's forward passes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from adapter_format.base_models import BASE_MODELS
from shared.models import DatasetVersionRecord, TrainingSettings
from shared.runs import forecast
from tests.fakes import OFFER
from tests.harness import Harness

BIG = "meta-llama/Llama-3.1-8B-Instruct"
PAIR = {"prompt": "2+2=", "chosen": "4", "rejected": "5"}
CHAT_PAIR = {"messages": [{"role": "user", "content": "hi"}], "chosen": {"role": "assistant", "content": "Hello!"},
             "rejected": {"role": "assistant", "content": "go away"}}
EXAMPLE = {"prompt": "2+2=", "completion": "4"}


def _upload(harness: Harness, project: str, rows: list[Any]) -> tuple[int, Any]:
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    status, got, _ = harness.call("POST", f"/api/projects/{project}/datasets", token="member", body=body,
                            content_type="application/x-ndjson")
    return status, got


def _create(harness: Harness, project: str, dataset: str, **training: Any) -> tuple[int, Any]:
    body = {"project_id": project, "dataset_version_id": dataset, "provider": "memory", "offer_id": "mem-a10",
            "base_model": BIG, "price_limit_per_hour": 10.0, "training": training}
    status, got, _ = harness.call("POST", "/api/runs", token="member", json_body=body)
    return status, got


def test_pairs_are_checked_at_upload_and_never_mixed_with_examples(harness: Harness) -> None:
    project = harness.ok("POST", "/api/projects", json_body={"name": "dpo"})["id"]
    status, got = _upload(harness, project, [PAIR, CHAT_PAIR])
    assert status == 201, got
    assert got["format"] == "pairs" and got["rows"] == 2
    status, got = _upload(harness, project, [EXAMPLE])
    assert status == 201 and got["format"] == "examples"
    bad = [
        {"prompt": "x", "chosen": "a"},  # no rejected
        {"prompt": "x", "chosen": "a", "rejected": "a"},  # the same answer twice
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
         "chosen": {"role": "assistant", "content": "b"}, "rejected": {"role": "assistant", "content": "c"}},
        {"messages": [{"role": "user", "content": "q"}], "chosen": "b", "rejected": {"role": "assistant", "content": "c"}},
        {"chosen": "a", "rejected": "b"},
    ]
    status, got = _upload(harness, project, [PAIR, *bad])
    assert status == 422, got
    lines = {e["line"]: e["message"] for e in got["errors"]}
    assert sorted(lines) == [2, 3, 4, 5, 6]
    assert "rejected" in lines[2] and "same answer" in lines[3] and "end before the answer" in lines[4]
    assert "assistant turn" in lines[5] and "needs \"prompt\"" in lines[6]
    status, got = _upload(harness, project, [PAIR, EXAMPLE])
    assert status == 422 and got["errors"][0]["line"] == 2 and "all pairs" in got["errors"][0]["message"]
    status, got = _upload(harness, project, [EXAMPLE, PAIR])
    assert status == 422 and got["errors"][0]["line"] == 2 and "preference pair among" in got["errors"][0]["message"]


def test_the_method_must_match_the_dataset_and_its_settings_are_bounded(harness: Harness) -> None:
    project = harness.ok("POST", "/api/projects", json_body={"name": "dpo"})["id"]
    pairs = _upload(harness, project, [PAIR] * 30)[1]["id"]
    examples = _upload(harness, project, [EXAMPLE] * 30)[1]["id"]
    status, got = _create(harness, project, examples, method="dpo")
    assert status == 422 and got["errors"][0]["field"] == "dataset_version_id"
    assert "not preference pairs" in got["detail"] and "set training.method to sft" in got["detail"]
    status, got = _create(harness, project, pairs)
    assert status == 422 and "set training.method to dpo" in got["detail"]
    for bad in ({"dpo_beta": 0}, {"dpo_beta": 11}, {"dpo_beta": "0.1"}, {"dpo_loss": "hinge"}, {"method": "orpo"}):
        status, got = _create(harness, project, pairs, **{"method": "dpo", **bad})
        assert status == 422, (bad, got)
        assert any(next(iter(bad)) in e["field"] for e in got["errors"]), got
    status, got = _create(harness, project, pairs, method="dpo", dpo_beta=0.5, dpo_loss="ipo")
    assert status == 201, got
    assert (got["training"]["method"], got["training"]["dpo_beta"], got["training"]["dpo_loss"]) == ("dpo", 0.5, "ipo")
    assert "DPO: the reference model's forward pass" in got["forecast"]["basis"]


def test_the_forecast_counts_the_reference_forward_pass() -> None:
    ds = DatasetVersionRecord(org="o", project_id="p", id="d", rows=1000, sha256="0" * 64, size_bytes=1_200_000,
                              storage_key="k", created_at=datetime.now(UTC), format="pairs")
    model = BASE_MODELS[BIG]
    for checkpointing, factor in ((True, 8 / 6), (False, 6 / 4)):
        sft = forecast.predict(ds, TrainingSettings(kind="full", gradient_checkpointing=checkpointing), model, OFFER)
        dpo = forecast.predict(ds, TrainingSettings(kind="full", gradient_checkpointing=checkpointing,
                                                    method="dpo"), model, OFFER)
        assert dpo.tokens == sft.tokens
        assert sft.throughput_tokens_per_s / dpo.throughput_tokens_per_s == pytest.approx(factor, rel=1e-3)
    # A pair is two sequences, each cut at max_seq_len: 8,000 bytes a pair is 2,000 tokens, 2 x 512 kept.
    long = ds.model_copy(update={"size_bytes": 8_000_000})
    assert forecast.tokens_per_example(long, TrainingSettings(method="dpo", max_seq_len=512)) == 1024
    assert forecast.tokens_per_example(long, TrainingSettings(max_seq_len=512)) == 512
    # Measured paces are kept apart: an SFT run's pace is not a DPO run's.
    assert forecast.like_key("aws", BIG, "A10", TrainingSettings(method="dpo")) != \
        forecast.like_key("aws", BIG, "A10", TrainingSettings())


def test_the_preference_metrics_reach_the_eval_curve(harness: Harness) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.5, [
        "progress=0.5 step=3 loss=0.6 lr=0.01",
        "eval step=3 eval_loss=0.6500 preference_accuracy=0.7500 reward_margin=0.1234",
        "eval step=6 eval_loss=0.6000 preference_accuracy=1.5 reward_margin=nan",  # out of range: left out
        "eval step=9 eval_loss=0.5000"])
    got = harness.ok("GET", f"/api/runs/{run_id}/metrics")
    assert got["eval_points"] == [
        {"step": 3, "eval_loss": 0.65, "preference_accuracy": 0.75, "reward_margin": 0.1234},
        {"step": 6, "eval_loss": 0.6}, {"step": 9, "eval_loss": 0.5}]


def test_runs_get_prints_the_preference_curve(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from tensorant_cli import main as cli
    from tests.test_forecast import RUN

    metrics = {"points": [], "eval_points": [
        {"step": 3, "eval_loss": 0.65, "preference_accuracy": 0.5, "reward_margin": 0.01},
        {"step": 6, "eval_loss": 0.6, "preference_accuracy": 0.75, "reward_margin": 0.1234}], "eval_loss": 0.6}

    class Client:
        def __init__(self, url: str = "", token: str | None = None) -> None:
            pass

        def get(self, path: str, **params: str) -> Any:
            return metrics if path.endswith("/metrics") else {**RUN, "state": "training"}

    monkeypatch.setattr(cli, "Client", Client)
    assert cli.main(["runs", "get", "r-1"]) == 0
    out = capsys.readouterr().out
    assert "preference accuracy" in out and "50% -> 75% at step 6, reward margin 0.1234" in out, out



def test_runs_watch_ends_with_the_last_preference_accuracy() -> None:
    import io

    from tensorant_cli.commands.watch import watch
    from tests.test_forecast import RUN

    metrics = {"points": [], "eval_points": [
        {"step": 3, "eval_loss": 0.65, "preference_accuracy": 0.5, "reward_margin": 0.01},
        {"step": 6, "eval_loss": 0.6, "preference_accuracy": 0.75, "reward_margin": 0.1234}], "eval_loss": 0.6}
    done = [{"at": "2026-01-01T00:00:00Z", "kind": "transition", "state": "succeeded", "message": "-> succeeded"}]
    asked: list[str] = []

    class Client:
        def __init__(self, method: str) -> None:
            self.method = method

        def get(self, path: str, **params: str) -> Any:
            asked.append(path)
            if path.endswith("/metrics"):
                return metrics
            if path.endswith("/logs"):
                return {"lines": [], "next": None}
            return {**RUN, "state": "succeeded", "events": done, "training": {"method": self.method}}

    out = io.StringIO()
    assert watch(Client("dpo"), "r-1", interval=0, stream=out) == 0  # type: ignore[arg-type]
    assert "preference accuracy" in out.getvalue() and "75% at step 6, reward margin 0.1234" in out.getvalue()
    # An SFT run's end reads no metrics (a rate-limited read) and says no preference.
    asked.clear()
    out = io.StringIO()
    assert watch(Client("sft"), "r-1", interval=0, stream=out) == 0  # type: ignore[arg-type]
    assert "preference" not in out.getvalue() and not any(p.endswith("/metrics") for p in asked)


def test_the_metrics_answer_is_what_the_openapi_document_says(harness: Harness) -> None:
    from shared.services.api.runs.logs import RunMetrics

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.5, [
        "progress=0.5 step=3 loss=0.6 lr=0.01",
        "eval step=3 eval_loss=0.6500 preference_accuracy=0.7500 reward_margin=-0.1234"])
    got = harness.ok("GET", f"/api/runs/{run_id}/metrics")
    parsed = RunMetrics.model_validate(got)
    assert parsed.eval_points[0].preference_accuracy == 0.75 and parsed.eval_points[0].reward_margin == -0.1234
    assert set(got) == set(RunMetrics.model_fields)  # every key documented, none undocumented
    doc = harness.ok("GET", "/api/openapi.json")
    op = doc["paths"]["/api/runs/{id}/metrics"]["get"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RunMetrics"}
    point = doc["components"]["schemas"]["EvalPoint"]["properties"]
    assert {"preference_accuracy", "reward_margin"} <= set(point)
    assert {"type": "number", "minimum": 0, "maximum": 1} in point["preference_accuracy"]["anyOf"]
    assert [q["name"] for q in op["parameters"] if q["in"] == "query"] == ["after"]

def test_the_fit_counts_both_sequences_of_a_pair() -> None:
    from shared.runs.admission import memory_needed

    model = BASE_MODELS[BIG]
    assert memory_needed(model, TrainingSettings(method="dpo", batch_size=4)) == \
        memory_needed(model, TrainingSettings(batch_size=8)) > memory_needed(model, TrainingSettings(batch_size=4))
