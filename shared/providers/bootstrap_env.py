"""The agent's bootstrap environment as ONE variable that no value can split.

contracts.md: the control plane hands the agent TENSORANT_BOOTSTRAP = base64(JSON object
str -> str). A cloud-init env file and a RunPod pod env both carry only that line, so a run
field holding \\r, \\v, \\x85, \\u2028 or any other line break cannot add a variable: base64's
alphabet has no line-breaking character, and JSON escapes every control character.
The agent decodes it at start (machine/agent) and overlays it on its environment.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from typing import Any

from shared.log import register_secret
from shared.security import ORG_RE, RUN_RE
from shared.settings import get_settings

VAR = "TENSORANT_BOOTSTRAP"
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def encode(env: dict[str, str]) -> str:
    """base64 of the JSON object; refuses names that are not environment names."""
    for key, value in env.items():
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise ValueError(f"environment name {key!r} is not valid")
        if not isinstance(value, str):
            raise ValueError(f"environment value for {key} must be a string")
    # ensure_ascii: every non-ASCII code point (U+2028, U+0085...) becomes a \\uXXXX escape.
    raw = json.dumps(env, ensure_ascii=True, sort_keys=True, separators=(",", ":")).encode()
    blob = base64.b64encode(raw).decode()
    register_secret(blob)  # it carries the run token and presigned URLs
    return blob


def decode(blob: str) -> dict[str, str]:
    """The inverse of encode; a malformed blob raises ValueError (the agent exits with it)."""
    try:
        data: Any = json.loads(base64.b64decode(blob.encode(), validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{VAR} is not base64 JSON ({type(exc).__name__})") from exc
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ValueError(f"{VAR} must be a JSON object of strings")
    return data


def pod_env(env: dict[str, str]) -> list[dict[str, str]]:
    """RunPod's env input: the same single variable."""
    return [{"key": VAR, "value": encode(env)}]


# The bootstrap claim (EC2 user data, Azure customData): readable by any process on the machine
# through the metadata service for the machine's whole life, and Azure's API says to keep secrets
# out of customData. So user data carries only this claim, which the machine exchanges once for its
# environment (POST /api/agent/runs/{id}/bootstrap, services/api/boot.exchange_claim): accepted only
# while the run is provisioning and never claimed, it is dead after its first exchange. It is a MAC of
# the deployment, org and run (no expiry, no nonce), so every launch attempt of a run renders the same
# user data and a retried RunInstances sends identical parameters.
CLAIM_PREFIX = "tcl1"
CLAIM_MAX_CHARS = 300


def _claim_mac(secret: str, org: str, run_id: str) -> str:
    message = f"tensorant-bootstrap-claim:{get_settings().deployment_id}:{org}:{run_id}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def claim(org: str, run_id: str) -> str:
    return f"{CLAIM_PREFIX}.{org}.{run_id}.{_claim_mac(get_settings().jwt_secret, org, run_id)}"


def claim_org(text: str, run_id: str) -> tuple[str, bool] | None:
    """The org a claim for this run was made for, and whether it is signed with the previous key of a
    rotation (the exchange then accepts it only for a run launched before the new key was first seen,
    as for agent tokens); None when it is not one this deployment made."""
    parts = text.split(".")
    if len(text) > CLAIM_MAX_CHARS or len(parts) < 4 or parts[0] != CLAIM_PREFIX:
        return None
    org, run, mac = parts[1], ".".join(parts[2:-1]), parts[-1]
    if run != run_id or not ORG_RE.fullmatch(org) or not RUN_RE.fullmatch(run):
        return None
    settings = get_settings()
    for previous, secret in enumerate([settings.jwt_secret,
                                       *([settings.jwt_secret_previous] if settings.jwt_secret_previous else [])]):
        if hmac.compare_digest(mac, _claim_mac(secret, org, run)):
            return org, bool(previous)
    return None
