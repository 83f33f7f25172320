"""What a cloud launch put on the wire: the container image and the agent's bootstrap
environment, decoded from cloud-init user data (AWS, Azure) as a machine would read it."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from shared.providers import bootstrap_env

TRAINING = {"lora_r": 8, "lora_alpha": 16, "target_modules": "all-linear", "max_seq_len": 512, "seed": 11}


def from_user_data(user_data_b64: str, h: Any) -> tuple[str, dict[str, str]]:
    """(image, bootstrap env) from base64 cloud-init user data, as the machine gets them: the user data
    holds the image and a one-time claim (no secret), which the machine exchanges once at the control
    plane for its environment (here through the harness `harness`)."""
    text = base64.b64decode(user_data_b64).decode()
    assert not re.search(rf"^\s*{bootstrap_env.VAR}=\S{{16,}}$", text, re.M), \
        "the environment (tokens, keys) must not be in the user data"
    claim = re.search(r'"claim":"([^"]+)"', text)
    url = re.search(r"^\s*CLAIM_URL=(\S+)$", text, re.M)
    image = re.search(r"^\s*IMAGE=(\S+)$", text, re.M)
    assert claim and url and image, text
    path = "/api/" + url.group(1).strip("'").split("/api/", 1)[1]
    got = h.ok("POST", path, token=None, json_body={"claim": claim.group(1)})
    return image.group(1).strip("'"), bootstrap_env.decode(got["bootstrap"])


def assert_training_sent(env: dict[str, str], run: dict[str, Any]) -> None:
    sent = json.loads(env["TENSORANT_TRAINING"])
    assert sent == run["training"]
    assert {k: sent[k] for k in TRAINING} == TRAINING
    assert sent["kind"] == "trial" and sent["max_steps"] == 30 and sent["max_examples"] == 64
