"""Secrets out of user data (issue 27.3): EC2 user data and Azure customData stay readable by any process on
the machine through the metadata service, so a launched run's user data holds a one-time claim only, which
the machine exchanges once for its environment; a second exchange is refused and recorded on the run.
(The whole path, exchange included, runs in tests/e2e/test_bootstrap_e2e.py's played machines.)"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest

from shared.models import RunState
from shared.providers import bootstrap_env, cloudinit
from shared.store import get_store
from tests.e2e.boot import BootHarness
from tests.e2e.test_bootstrap_e2e import _aws_launch

pytestmark = pytest.mark.e2e

HF = "hf_" + "Qx7" * 12


def _claim(user_data: str) -> str:
    found = re.findall(r'\{"claim":"([^"]+)"\}', user_data)
    assert len(found) == 1, user_data
    return found[0]


def test_user_data_holds_no_secret_and_the_claim_is_good_once(boot_aws_h: tuple[BootHarness, Any]) -> None:
    h, ec2 = boot_aws_h
    h.ok("PUT", "/api/org/secrets/huggingface-token", json_body={"token": HF})
    run_id, _, user_data = _aws_launch(h, ec2)
    record, _ = get_store().runs.get("org-a", run_id)
    assert record.state == RunState.provisioning and record.machine_up_at is not None
    # A machine that never reaches the control plane is due within minutes, not at the boot deadline.
    assert record.deadlines.first_report_by is not None and record.deadlines.provisioning_by is not None
    assert (record.deadlines.first_report_by - record.machine_up_at).total_seconds() == cloudinit.FIRST_REPORT_S
    boot_by = record.deadlines.provisioning_by

    for secret in (HF, "X-Amz-Signature", "eyJ", "TENSORANT_RUN_TOKEN", "AKIABOOTTEST0001"):
        assert secret not in user_data, secret
    assert not re.search(r"TENSORANT_BOOTSTRAP=[A-Za-z0-9+/]", user_data)
    claim = _claim(user_data)
    path = f"/api/agent/runs/{run_id}/bootstrap"

    h.clock.advance(120)
    got = h.ok("POST", path, token=None, json_body={"claim": claim})
    env = json.loads(base64.b64decode(got["bootstrap"]))
    assert env["TENSORANT_RUN_TOKEN"] == got["token"] and env["HF_TOKEN"] == HF
    assert env["TENSORANT_RUN_ID"] == run_id and env["TENSORANT_DATA_DIR"] == cloudinit.CONTAINER_DATA_DIR
    assert any("X-Amz-Signature" in v for v in env.values())  # presigned storage URLs come with it
    h.ok("POST", f"/api/agent/runs/{run_id}/heartbeat", token=got["token"], json_body={"phase": "preparing"})

    record, _ = get_store().runs.get("org-a", run_id)
    assert record.bootstrap_claimed_at is not None
    assert record.deadlines.provisioning_by is not None and record.deadlines.provisioning_by > boot_by

    status, body, _ = h.call("POST", path, token=None, json_body={"claim": claim})
    assert status == 409 and "refused" in json.dumps(body), body
    events = h.get_run(run_id)["events"]
    assert any("second exchange of the machine's bootstrap claim was refused" in e["message"] for e in events)


def test_a_claim_for_another_run_or_forged_is_refused(boot_aws_h: tuple[BootHarness, Any]) -> None:
    h, ec2 = boot_aws_h
    run_id, _, user_data = _aws_launch(h, ec2)
    claim = _claim(user_data)
    forged = claim[:-4] + ("0000" if not claim.endswith("0000") else "1111")
    for path, body in ((f"/api/agent/runs/{run_id}/bootstrap", {"claim": forged}),
                       (f"/api/agent/runs/{run_id}x/bootstrap", {"claim": claim}),
                       (f"/api/agent/runs/{run_id}/bootstrap", {"claim": bootstrap_env.claim("org-b", run_id)})):
        status, answer, _ = h.call("POST", path, token=None, json_body=body)
        assert status in (401, 404), (status, answer)
    record, _ = get_store().runs.get("org-a", run_id)
    assert record.bootstrap_claimed_at is None  # none of them used the claim up
    h.ok("POST", f"/api/agent/runs/{run_id}/bootstrap", token=None, json_body={"claim": claim})
