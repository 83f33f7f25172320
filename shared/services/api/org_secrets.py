"""Organization secrets: the Hugging Face token (for gated models).

Write-only, like connection secrets: sealed at rest with AES-GCM (shared/security.seal) with
"<org>|secret:<name>" as the associated data, so a blob copied to another org's row does not
open; never returned, never logged (registered with the log redaction whenever opened). It
is handed to one place only: the run's bootstrap (HF_TOKEN), which the agent forwards to the
trainer alone and masks in every forwarded log line.
"""

from __future__ import annotations

from typing import Any

from shared.clock import now
from shared.log import register_secret
from shared.models import OrgSecretRecord, OrgSecretSet, OrgSecretsView, Role
from shared.security import Principal, require, seal, unseal
from shared.store import get_store

HF_TOKEN = "huggingface-token"


def _aad(org: str, name: str) -> str:
    return f"{org}|secret:{name}"


def _view(org: str) -> OrgSecretsView:
    return OrgSecretsView(huggingface_token={"set": get_store().secrets.get(org, HF_TOKEN) is not None})


def show(principal: Principal) -> OrgSecretsView:
    """Which secrets are set (never their values); owners only, as for saving them."""
    require(principal, Role.owner)
    return _view(principal.org)


def set_hf_token(principal: Principal, body: OrgSecretSet) -> OrgSecretsView:
    require(principal, Role.owner)
    register_secret(body.token)
    get_store().secrets.put(OrgSecretRecord(
        org=principal.org, name=HF_TOKEN, sealed=seal({"value": body.token}, aad=_aad(principal.org, HF_TOKEN)),
        saved_at=now(), saved_by=principal.sub))
    return _view(principal.org)


def delete_hf_token(principal: Principal) -> None:
    require(principal, Role.owner)
    get_store().secrets.delete(principal.org, HF_TOKEN)


def hf_token(org: str) -> str:
    """The org's Hugging Face token for a run's bootstrap, or "" when none is set."""
    rec = get_store().secrets.get(org, HF_TOKEN)
    if rec is None:
        return ""
    value: Any = unseal(rec.sealed, aad=_aad(org, HF_TOKEN)).get("value", "")
    token = value if isinstance(value, str) else ""
    register_secret(token)  # masked in every log line and error text from here on
    return token
