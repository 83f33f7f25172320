"""A draft's edit (PATCH /api/runs/{id}) is checked as a create of the edited draft.

Before: PATCH saved an undeclared base model (`evil/private-model`, which the machine then fetched
from the hub with the org's token), skipped the GPU fit and the local 1B cap, the org's limits,
and switched `kind` without the trial settings following (kind full, training.kind trial).
Each case here is refused by create, and the same edit of a valid draft is refused by PATCH
with the same 422 field, leaving the stored draft as it was.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.context import Context
from shared.store import get_store
from tests.harness import Harness

BIG = "meta-llama/Llama-3.1-8B-Instruct"  # 8B: more than the 24 GB card holds in bf16
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
LOCAL = {"provider": "local", "offer_id": "local-smoke", "base_model": SMOL}


@pytest.fixture(autouse=True)
def local_and_roomy_limits(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local provider connected too, and limits no edit here runs into by accident (the operator's
    ceiling raised)."""
    from shared.settings import reset_settings

    monkeypatch.setenv("TENSORANT_ORG_RUNS_PER_MINUTE_CEILING", "1000")
    reset_settings()
    harness.save_compute("local", {})
    harness.ok("PUT", "/api/org/limits", json_body={"runs_per_minute": 1000, "max_price_limit_per_hour": 20,
                                              "max_runtime_limit_s": 86400})


def create(harness: Harness, project: tuple[str, str], **fields: Any) -> tuple[int, Any]:
    body = {"project_id": project[0], "dataset_version_id": project[1], "provider": "memory", "offer_id": "mem-a10",
            "base_model": "tensorant/tiny-llama", "price_limit_per_hour": 10.0} | fields
    status, got, _ = harness.call("POST", "/api/runs", token="member", json_body=body)
    return status, got


def stored(run_id: str) -> dict[str, Any]:
    return get_store().runs.get("org-a", run_id)[0].model_dump(mode="json")


def fields_of(body: Any) -> list[str]:
    return [e["field"] for e in body.get("errors", [])]


CASES = [
    # (the valid draft, the edit, the field both create and PATCH refuse)
    ({}, {"base_model": "evil/private-model"}, "base_model"),
    # An 8B model at 4 x 4096 tokens does not fit the 24 GB card in bf16; in 4-bit it does.
    ({"training": {"max_seq_len": 4096}}, {"base_model": BIG}, "offer_id"),
    ({"base_model": BIG, "training": {"load_in_4bit": True, "max_seq_len": 4096}},
     {"training": {"load_in_4bit": False, "max_seq_len": 4096}}, "offer_id"),
    ({"base_model": BIG, "training": {"load_in_4bit": True, "max_seq_len": 4096}},
     {"training": {"load_in_4bit": False, "max_seq_len": 4096}, "offer_id": "mem-a10"}, "offer_id"),
    (LOCAL, {"base_model": "Qwen/Qwen2.5-7B-Instruct"}, "offer_id"),  # the local provider's 1B cap
    (LOCAL, {"training": {"load_in_4bit": True}}, "offer_id"),  # no CUDA on the local provider
    ({}, {"training": {"lora_r": 0}}, "training.lora_r"),
    ({}, {"training": {"learning_rate": "0.001"}}, "training.learning_rate"),
    ({}, {"training": {"target_modules": "mlp"}}, "training.target_modules"),
    ({}, {"training": {"lora_rank": 8}}, "training.lora_rank"),
    ({}, {"training": {"kind": "full"}}, "training.kind"),  # the run is a trial
    ({"kind": "full"}, {"kind": "trial", "training": {"kind": "full"}}, "training.kind"),
    ({}, {"offer_id": "mem-nope"}, "offer_id"),
    ({}, {"provider": "aws"}, "provider"),  # no aws connection saved
    ({}, {"price_limit_per_hour": 50.0}, "price_limit_per_hour"),  # above the org's 20/h
    ({}, {"runtime_limit_s": 3 * 86400}, "runtime_limit_s"),  # above the org's 1 day
]


@pytest.mark.parametrize(("valid", "edit", "field"), CASES)
def test_patch_refuses_what_create_refuses_and_changes_nothing(
        harness: Harness, valid: dict[str, Any], edit: dict[str, Any], field: str) -> None:
    project = harness.project_and_dataset(rows=100)
    status, body = create(harness, project, **(valid | edit))
    assert status == 422 and field in fields_of(body), body  # create refuses it
    status, run = create(harness, project, **valid)
    assert status == 201, run
    before, events = stored(run["id"]), harness.get_run(run["id"])["events"]
    status, body, headers = harness.call("PATCH", f"/api/runs/{run['id']}", token="member", json_body=edit)
    assert status == 422 and field in fields_of(body), body
    assert headers["Content-Type"].startswith("application/problem+json")
    assert stored(run["id"]) == before  # a refused edit changes nothing
    assert harness.get_run(run["id"])["events"] == events


def test_a_dataset_of_another_project_is_refused_by_patch(harness: Harness) -> None:
    project, other = harness.project_and_dataset(), harness.project_and_dataset()
    run = create(harness, project)[1]
    before = stored(run["id"])
    status, body, _ = harness.call("PATCH", f"/api/runs/{run['id']}", json_body={"dataset_version_id": other[1]})
    assert status == 422 and fields_of(body) == ["dataset_version_id"], body
    assert stored(run["id"]) == before


def test_test_models_are_refused_by_patch_off_local(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.settings import reset_settings

    project = harness.project_and_dataset()
    run = create(harness, project, **(LOCAL | {"base_model": "tensorant/smoke-tiny"}))[1]
    monkeypatch.setenv("TENSORANT_ALLOW_TEST_MODELS", "0")
    reset_settings()
    before = stored(run["id"])
    status, body, _ = harness.call("PATCH", f"/api/runs/{run['id']}", json_body={"provider": "memory", "offer_id": "mem-a10"})
    assert status == 422 and fields_of(body) == ["base_model"], body
    assert stored(run["id"]) == before


def test_a_kind_switch_resolves_the_training_settings_as_create_would(harness: Harness) -> None:
    project = harness.project_and_dataset(rows=100)
    trial = create(harness, project, training={"seed": 7})[1]
    assert (trial["training"]["kind"], trial["training"]["max_steps"], trial["runtime_limit_s"]) == ("trial", 30, 1200)
    full = harness.ok("PATCH", f"/api/runs/{trial['id']}", token="member", json_body={"kind": "full"})
    as_created = create(harness, project, kind="full", training={"seed": 7})[1]
    assert full["kind"] == "full"
    assert full["training"] == as_created["training"]  # kind full, no trial bounds, the seed kept
    assert (full["training"]["kind"], full["training"]["max_steps"], full["training"]["max_examples"]) == (
        "full", None, None)
    assert full["runtime_limit_s"] == as_created["runtime_limit_s"] == 3600  # the trial's 20 min default went too
    assert stored(trial["id"])["training"] == full["training"]  # what the trainer is handed
    assert any("full run: trains on all 100 examples" in e["message"] for e in full["events"])
    # And back: the trial's bounds apply again; a user's own smaller bound is kept.
    back = harness.ok("PATCH", f"/api/runs/{trial['id']}", json_body={"kind": "trial", "training": {"max_steps": 5}})
    assert (back["training"]["kind"], back["training"]["max_steps"], back["training"]["max_examples"]) == (
        "trial", 5, 64)
    assert back["runtime_limit_s"] == 1200
    again = harness.ok("PATCH", f"/api/runs/{trial['id']}", json_body={"kind": "full"})
    assert (again["training"]["max_steps"], again["training"]["seed"]) == (5, 7)  # the user's, not the trial's


def test_training_edit_keeps_the_settings_left_out_and_is_fit_checked(harness: Harness) -> None:
    project = harness.project_and_dataset()
    run = create(harness, project, base_model=BIG, training={"load_in_4bit": True, "lora_r": 8})[1]
    got = harness.ok("PATCH", f"/api/runs/{run['id']}", json_body={"training": {"seed": 3}})
    assert (got["training"]["load_in_4bit"], got["training"]["lora_r"], got["training"]["seed"]) == (True, 8, 3)
    got = harness.ok("PATCH", f"/api/runs/{run['id']}", json_body={"training": {"max_steps": 5}})
    assert (got["training"]["max_steps"], got["training"]["seed"]) == (5, 3)
    got = harness.ok("PATCH", f"/api/runs/{run['id']}", json_body={"training": {"max_steps": None}})
    assert got["training"]["max_steps"] == 30  # cleared: the trial's bound again
    # A change of the model alone is checked with the training settings as they are.
    status, body, _ = harness.call("PATCH", f"/api/runs/{run['id']}", json_body={"training": {"batch_size": 64,
                                                                                       "max_seq_len": 8192}})
    assert status == 422 and fields_of(body) == ["offer_id"], body


def test_an_edit_checked_against_a_draft_changed_meanwhile_is_refused(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two edits at once, each valid alone (a big model in 4-bit; then 4-bit off on the same card):
    the second checked the draft as it was before the first, so it is refused, not saved unchecked."""
    from shared.runs import admission as runs

    project = harness.project_and_dataset()
    run = create(harness, project, training={"load_in_4bit": True})[1]
    real = runs.admit

    def with_a_concurrent_edit(ctx: Context, org: str, body: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(ctx, org, body, *args, **kwargs)
        monkeypatch.setattr(runs, "admit", real)
        harness.ok("PATCH", f"/api/runs/{run['id']}", json_body={"base_model": BIG})  # fits: still 4-bit
        return out

    monkeypatch.setattr(runs, "admit", with_a_concurrent_edit)
    status, body, _ = harness.call("PATCH", f"/api/runs/{run['id']}", json_body={"training": {"load_in_4bit": False}})
    assert status == 409 and "changed by another request" in body["detail"], body
    got = stored(run["id"])
    assert (got["base_model"], got["training"]["load_in_4bit"]) == (BIG, True)  # never BIG without 4-bit on 24 GB


def test_a_draft_saved_before_requests_were_stored_switches_kind_too(harness: Harness) -> None:
    """Older drafts have no stored request: it is rebuilt, the trial's defaults and bounds taken out."""
    project = harness.project_and_dataset()
    run_id = create(harness, project, training={"max_steps": 5})[1]["id"]
    store = get_store()
    run, etag = store.runs.get("org-a", run_id)
    store.runs.put(run.model_copy(update={"request": None}), etag)
    full = harness.ok("PATCH", f"/api/runs/{run_id}", json_body={"kind": "full"})
    t = full["training"]
    assert (t["kind"], t["max_steps"], t["max_examples"], full["runtime_limit_s"]) == ("full", 5, None, 3600)
