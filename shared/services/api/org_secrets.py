"""Organization secrets: the Hugging Face token (for gated models), and the metrics trackers (MLflow, W&B).

Write-only, like connection secrets: sealed at rest with AES-GCM (shared/security.seal) with
"<org>|secret:<name>" as the associated data, so a blob copied to another org's row does not
open; never returned, never logged (registered with the log redaction whenever opened). It
is handed to one place only: the run's bootstrap (HF_TOKEN), which the agent forwards to the
trainer alone and masks in every forwarded log line.
"""

from __future__ import annotations

from typing import Any

from shared.clock import now
from shared.context import Context
from shared.log import register_secret
from shared.models import OrgMlflowSet, OrgSecretRecord, OrgSecretSet, OrgSecretsView, OrgWandbSet, Role
from shared.security import Principal, require, seal, unseal

HF_TOKEN = "huggingface-token"
MLFLOW = "mlflow"
WANDB = "wandb"


def _aad(org: str, name: str) -> str:
    return f"{org}|secret:{name}"


def _view(ctx: Context, org: str) -> OrgSecretsView:
    secrets = ctx.store.secrets
    return OrgSecretsView(huggingface_token={"set": secrets.get(org, HF_TOKEN) is not None},
                          mlflow={"set": secrets.get(org, MLFLOW) is not None},
                          wandb={"set": secrets.get(org, WANDB) is not None})


def show(ctx: Context, principal: Principal) -> OrgSecretsView:
    """Which secrets are set (never their values); owners only, as for saving them."""
    require(principal, Role.owner)
    return _view(ctx, principal.org)


def set_hf_token(ctx: Context, principal: Principal, body: OrgSecretSet) -> OrgSecretsView:
    require(principal, Role.owner)
    register_secret(body.token)
    ctx.store.secrets.put(OrgSecretRecord(
        org=principal.org, name=HF_TOKEN, sealed=seal({"value": body.token}, aad=_aad(principal.org, HF_TOKEN)),
        saved_at=now(), saved_by=principal.sub))
    return _view(ctx, principal.org)


def delete_hf_token(ctx: Context, principal: Principal) -> None:
    require(principal, Role.owner)
    ctx.store.secrets.delete(principal.org, HF_TOKEN)


def hf_token(ctx: Context, org: str) -> str:
    """The org's Hugging Face token for a run's bootstrap, or "" when none is set."""
    rec = ctx.store.secrets.get(org, HF_TOKEN)
    if rec is None:
        return ""
    value: Any = unseal(rec.sealed, aad=_aad(org, HF_TOKEN)).get("value", "")
    token = value if isinstance(value, str) else ""
    register_secret(token)  # masked in every log line and error text from here on
    return token


def _put(ctx: Context, principal: Principal, name: str, value: dict[str, str]) -> OrgSecretsView:
    require(principal, Role.owner)
    for k, v in value.items():
        if k in _SECRET_VARS:  # not the experiment or project name: "tensorant" would be masked everywhere
            register_secret(v)
    ctx.store.secrets.put(OrgSecretRecord(
        org=principal.org, name=name, sealed=seal(value, aad=_aad(principal.org, name)), saved_at=now(),
        saved_by=principal.sub))
    return _view(ctx, principal.org)


def set_mlflow(ctx: Context, principal: Principal, body: OrgMlflowSet) -> OrgSecretsView:
    value = {"MLFLOW_TRACKING_URI": body.tracking_uri, "MLFLOW_EXPERIMENT_NAME": body.experiment}
    if body.token:
        value["MLFLOW_TRACKING_TOKEN"] = body.token
    return _put(ctx, principal, MLFLOW, value)


def set_wandb(ctx: Context, principal: Principal, body: OrgWandbSet) -> OrgSecretsView:
    return _put(ctx, principal, WANDB, {"WANDB_API_KEY": body.api_key, "WANDB_PROJECT": body.project})


def delete_tracker(ctx: Context, principal: Principal, name: str) -> None:
    require(principal, Role.owner)
    ctx.store.secrets.delete(principal.org, name)


# What of a tracker's sealed value is a secret (masked); the rest (experiment, project names) is not.
_SECRET_VARS = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY")


def tracking_env(ctx: Context, org: str) -> tuple[dict[str, str], frozenset[str]]:
    """The trainer's tracker environment from the org's saved trackers, and which of its variables are secret."""
    env: dict[str, str] = {}
    for name in (MLFLOW, WANDB):
        rec = ctx.store.secrets.get(org, name)
        if rec is None:
            continue
        value: Any = unseal(rec.sealed, aad=_aad(org, name))
        env.update({str(k): v for k, v in value.items() if isinstance(v, str) and v} if isinstance(value, dict) else {})
    for k in _SECRET_VARS:
        if k in env:
            register_secret(env[k])
    return env, frozenset(k for k in env if k in _SECRET_VARS)
