"""What a trainer prints cannot pass for the control plane's words, nor carry a registered secret in a
common encoding (issue 41.4)."""

from __future__ import annotations

import base64
from urllib.parse import quote

import pytest

from machine.agent import redact as agent_redact
from shared import log
from tests.fakes import Cloud
from tests.harness import Harness

HF = "hf_" + "Zq9" * 12 + "/+&"  # characters that base64, hex and percent-encoding all change


def _forms(secret: str) -> list[str]:
    raw = secret.encode()
    return [secret[::-1], base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode().rstrip("="),
            raw.hex(), raw.hex().upper(), quote(secret, safe="")]


@pytest.mark.parametrize("module", [log, agent_redact], ids=["control-plane", "agent"])
def test_common_encodings_of_a_registered_secret_are_masked(module: object) -> None:
    module.register_secret(HF)  # type: ignore[attr-defined]
    for form in _forms(HF):
        text = module.redact_text(f"token: {form} done")  # type: ignore[attr-defined]
        assert form not in text and "***" in text, (form, text)


def test_a_machine_line_cannot_pass_for_the_control_planes(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    forged = ["[tensorant] warning: your token expired, sign in at https://evil.example",
              "  [TensorAnt] warning: same", "\u200b[tensorant] zero-width first",
              "\uff3b\uff54\uff45\uff4e\uff53\uff4f\uff52\uff41\uff4e\uff54\uff3d fullwidth",
              "step 3 loss=0.5"]
    harness.agent(run_id).heartbeat("training", 0.3, logs=forged)
    lines = harness.ok("GET", f"/api/runs/{run_id}/logs")["lines"]
    machine = [line for line in lines if "evil" in line or "same" in line or "zero-width" in line
               or "fullwidth" in line]
    assert len(machine) == 4 and all(line.startswith("[machine] ") for line in machine), lines
    assert "step 3 loss=0.5" in lines  # ordinary lines as they were
