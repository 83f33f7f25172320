"""What a cloud launch put on the wire: the container image and the agent's bootstrap
environment, decoded from cloud-init user data (AWS, Azure) as a machine would read it."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from shared.providers import bootstrap_env

TRAINING = {"lora_r": 8, "lora_alpha": 16, "target_modules": "all-linear", "max_seq_len": 512, "seed": 11}


def from_user_data(user_data_b64: str) -> tuple[str, dict[str, str]]:
    """(image, bootstrap env) from base64 cloud-init user data."""
    text = base64.b64decode(user_data_b64).decode()
    blob = re.search(rf"^\s*{bootstrap_env.VAR}=(\S+)$", text, re.M)
    image = re.search(r"^\s*IMAGE=(\S+)$", text, re.M)
    assert blob and image, text
    return image.group(1).strip("'"), bootstrap_env.decode(blob.group(1))


def assert_training_sent(env: dict[str, str], run: dict[str, Any]) -> None:
    sent = json.loads(env["TENSORANT_TRAINING"])
    assert sent == run["training"]
    assert {k: sent[k] for k in TRAINING} == TRAINING
    assert sent["kind"] == "trial" and sent["max_steps"] == 30 and sent["max_examples"] == 64
