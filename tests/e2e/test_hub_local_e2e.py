"""A base model named by its Hub id and revision, end to end on the local provider: the dev host reads its
config.json from the fake hub on loopback (tests/hub_fake.py: SmolLM2's real config), keeps the derived shapes,
the agent process runs the smoke trainer with the pinned commit, and the verifier checks the adapter against
the shapes read from the hub."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.local_host import TERMINAL_OR_RETAINED, Client
from tests.e2e.test_local_e2e import setup_org
from tests.hub_fake import FakeHub, fake_hub, sha_of

pytestmark = pytest.mark.e2e
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(autouse=True)
def hub(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """Set before `api` starts the host (autouse fixtures come first)."""
    with fake_hub() as served:
        monkeypatch.setenv("TENSORANT_HF_ENDPOINT", served.url)
        monkeypatch.setenv("TENSORANT_ALLOW_PRIVATE_ENDPOINTS", "1")  # test-only: the fake hub is loopback http
        yield served


def test_local_run_on_a_hub_model_is_verified_against_its_derived_shapes(api: Client, hub: FakeHub) -> None:
    from shared.store import get_store

    project, dataset = setup_org(api)
    offers = api("GET", "/api/catalog/gpus?provider=local")["items"]
    run = api("POST", "/api/runs", json={"project_id": project, "dataset_version_id": dataset, "provider": "local",
                                         "offer_id": offers[0]["offer_id"], "base_model": SMOL,
                                         "base_model_revision": "main", "price_limit_per_hour": 1.0})
    assert run["state"] == "draft", run
    assert hub.count(f"/{SMOL}/resolve/{sha_of(SMOL)}/config.json") == 1
    record = get_store().runs.get("org-a", run["id"])[0]
    assert record.base_model_revision == sha_of(SMOL)
    kept = get_store().hub_models.get("org-a", SMOL, sha_of(SMOL))
    assert kept is not None and kept[0].note == "from the Hub's config.json" and kept[0].num_layers == 30
    api("POST", f"/api/runs/{run['id']}/launch", json={"confirm": True})
    done = api.wait(f"/api/runs/{run['id']}", lambda r: r["state"] in TERMINAL_OR_RETAINED)
    assert done["state"] == "succeeded", done
    verified = [e for e in done["events"] if "verif" in e["message"].lower()]
    assert verified, done["events"]
    assert hub.count("/config.json") == 1  # read once, at create: the verifier read the kept record


def test_an_unsupported_architecture_is_refused_at_create(api: Client, hub: FakeHub) -> None:
    hub.configs["acme/encoder"] = {"architectures": ["BertForMaskedLM"], "hidden_size": 768}
    project, dataset = setup_org(api)
    offers = api("GET", "/api/catalog/gpus?provider=local")["items"]
    r = api.s.post(api.url + "/api/runs", timeout=30, json={
        "project_id": project, "dataset_version_id": dataset, "provider": "local", "offer_id": offers[0]["offer_id"],
        "base_model": "acme/encoder", "base_model_revision": "main", "price_limit_per_hour": 1.0})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "base_model"
    assert "BertForMaskedLM is not supported" in r.json()["detail"]
