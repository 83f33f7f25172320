"""A DPO run's preference curve on its console page (issue 43), in real headless Chromium against a started
local host with the REAL trainer (tests/console/dpo_driver.mjs): the run is configured in the console (the
pairs uploaded, the Method following their format), launched and followed to succeeded on its page; the chart's
polylines are read back from the SVG and must lie where the run's metrics (GET /api/runs/{id}/metrics, from
the trainer's eval lines) put them; axe-core audits the page."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.local_host import ROOT, Client, LocalHost
from tests.test_console_browser import CHROMIUM, SHOTS, _browser_or_skip

pytestmark = pytest.mark.e2e
DRIVER = ROOT / "tests" / "console" / "dpo_driver.mjs"
BASE = "tensorant/tiny-llama"
# run.js's chart frame (viewBox 600 x 220; margins left 48, top 12, bottom 30; the preference chart's right
# margin 56 holds the reward margin's axis).
W, H, LEFT, TOP, BOTTOM, RIGHT = 600, 220, 48, 12, 30, 56


@pytest.fixture
def host(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHost]:
    from tests.e2e.local_host import start_local_host

    monkeypatch.setenv("TENSORANT_TORCH_THREADS", "1")
    yield from start_local_host(monkeypatch, None)  # the local provider's own trainer: machine.trainer.lora


def drive(scenario: str, **args: Any) -> dict[str, Any]:
    _browser_or_skip()
    SHOTS.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"chromium": CHROMIUM, "shots": str(SHOTS), **args})
    proc = subprocess.run(["node", str(DRIVER), scenario, payload], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"driver exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"], result["error"] + "\n" + "\n".join(result["problems"])
    assert result["problems"] == [], result["problems"]
    return result


def expected(evals: list[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """Where the chart must put each evaluation: steps across the plot; accuracy up from 0 to 1 on the left
    axis; the reward margin up over [min(0, margins), max(0, margins)] on the right one (mid-height or
    mid-width where a range is a single value)."""
    steps, margins = [p["step"] for p in evals], [p["reward_margin"] for p in evals]
    x0, x1, m0, m1 = min(steps), max(steps), min(0.0, *margins), max(0.0, *margins)
    span_x, span_y = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(step: int) -> float:
        return LEFT + (span_x / 2 if x1 == x0 else (step - x0) / (x1 - x0) * span_x)

    def y_margin(m: float) -> float:
        return H - BOTTOM - (span_y / 2 if m1 == m0 else (m - m0) / (m1 - m0) * span_y)

    return {"accuracy": [[x(p["step"]), H - BOTTOM - p["preference_accuracy"] * span_y] for p in evals],
            "margin": [[x(p["step"]), y_margin(p["reward_margin"])] for p in evals]}


def close(got: list[list[float]], want: list[list[float]]) -> bool:
    """The SVG's points are written to one decimal."""
    return len(got) == len(want) and all(abs(g - w) <= 0.051 for gp, wp in zip(got, want, strict=True)
                                         for g, w in zip(gp, wp, strict=True))


PROBES = [
    # A margin that turns positive: the right axis runs from the least margin to the most.
    [{"step": 10, "eval_loss": 0.7, "preference_accuracy": 0.25, "reward_margin": -0.2},
     {"step": 20, "eval_loss": 0.6, "preference_accuracy": 0.5, "reward_margin": 0.1},
     {"step": 40, "eval_loss": 0.5, "preference_accuracy": 1.0, "reward_margin": 0.6}],
    # One evaluation: at mid-width, with a dot for each series.
    [{"step": 5, "eval_loss": 0.69, "preference_accuracy": 0.75, "reward_margin": 0.05}],
    # An SFT run's evaluations carry no preference: no chart.
    [{"step": 2, "eval_loss": 2.2}, {"step": 4, "eval_loss": 2.0}],
]


def test_a_dpo_run_configured_in_the_console_shows_its_preference_curve(host: LocalHost, tmp_path: Path) -> None:
    api = Client(host.url, host.token)
    api("PUT", "/api/connections/storage", json={"kind": "local"})
    api("PUT", "/api/connections/compute/local", json={})
    assert api.wait("/api/connections/compute/local", lambda c: c["status"] != "checking", 30)["status"] == "connected"
    dataset = tmp_path / "pairs.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"What is {i} plus {i}?", "chosen": f"{i} plus {i} is {2 * i}.",
                                           "rejected": f"I do not know what {i} plus {i} is."}) + "\n"
                               for i in range(24)))
    training = {"dpo_beta": 0.1, "batch_size": 4, "sample_prompts": 0, "eval_every_steps": 2}
    got = drive("dpo", url=host.url, token=host.token, dataset=str(dataset), rows=24, base_model=BASE,
                offer="local-smoke", learning_rate=0.005, max_steps=6, max_seq_len=64, training=training,
                evaluations=3, probes=PROBES)
    assert got["method"] == "dpo"  # the form's Method followed the uploaded pairs
    run = api("GET", f"/api/runs/{got['runId']}")
    assert run["training"]["method"] == "dpo" and run["training"]["max_steps"] == 6, run["training"]
    assert run["state"] == "succeeded"
    evals = api("GET", f"/api/runs/{run['id']}/metrics")["eval_points"]
    assert [p["step"] for p in evals] == [2, 4, 6], evals
    chart = got["chart"]
    assert chart["viewBox"] == f"0 0 {W} {H}"
    want = expected(evals)
    assert close(chart["lines"]["accuracy"], want["accuracy"]), (chart["lines"], evals)
    assert close(chart["lines"]["margin"], want["margin"]), (chart["lines"], evals)
    # Its name says the first and last accuracy, in words for a screen reader; the axes say their ranges.
    first, last = evals[0], evals[-1]
    assert chart["label"].startswith(f"Held-out preference accuracy: {100 * first['preference_accuracy']:.0f} % "
                                     f"at step 2, {100 * last['preference_accuracy']:.0f} % at step 6"), chart["label"]
    assert chart["title"] == chart["label"]
    assert {"100 %", "0 %", "step 2", "step 6", f"{max(0.0, *[p['reward_margin'] for p in evals]):.3f}"} \
        <= set(chart["texts"]), chart["texts"]
    assert got["section"] == ["loss-chart", "preference-chart"]  # beside the loss curve, in its section
    assert f"reward margin {last['reward_margin']:.4f}" in got["words"], got["words"]

    negative, lone, sft = got["probes"]
    assert close(negative["lines"]["accuracy"], [[48, 145.5], [213.3, 101], [544, 12]]), negative
    assert close(negative["lines"]["margin"], [[48, 190], [213.3, 123.25], [544, 12]]), negative
    assert "-0.200" in negative["texts"] and "0.600" in negative["texts"]
    assert close(lone["lines"]["accuracy"], [[296, 56.5]]) and close(lone["lines"]["margin"], [[296, 12]]), lone
    assert sorted(c[0] for c in lone["circles"]) == ["accuracy", "margin"]
    assert sft is None

    too_wide = [m for m in got["measured"] if m["scroll"] > m["view"]]
    assert len(got["measured"]) == 2 and too_wide == [], got["measured"]
    assert got["violations"] == [], got["violations"]
