"""Bearer JWTs for users and agents, and AES-GCM sealing of connection secrets."""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from shared.clock import now_ts
from shared.context import Context
from shared.errors import Conflict, Forbidden, Unauthorized
from shared.key_rotation import current_key_since
from shared.log import register_secret
from shared.models import KEY_PATTERN, ORG_PATTERN, Role
from shared.settings import AGENT_TOKEN_MAX_TTL_S, get_settings

# Audiences: a user token is refused on the agent API and an agent token on the user API,
# even if its typ claim were forged. The issuer names the deployment.
USER_AUDIENCE = "tensorant-api"
AGENT_AUDIENCE = "tensorant-agent"
ORG_RE = re.compile(ORG_PATTERN)
SUB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}$")
RUN_RE = re.compile(KEY_PATTERN)
CLOCK_SKEW_S = 60


@dataclass(frozen=True)
class Principal:
    sub: str
    org: str
    role: Role


def _issuer() -> str:
    return f"tensorant:{get_settings().deployment_id}"


def mint_user_token(sub: str, org: str, role: Role, ttl_s: int = 12 * 3600) -> str:
    import jwt

    max_ttl = get_settings().user_token_max_ttl
    if ttl_s > max_ttl:
        raise ValueError(f"a user token's lifetime may be at most {max_ttl} s here; ask for a shorter one")
    if not ORG_RE.fullmatch(org) or not SUB_RE.fullmatch(sub):
        raise ValueError("org and sub must match their id patterns")
    iat = int(now_ts())
    claims = {"sub": sub, "org": org, "role": role.value, "typ": "user", "iat": iat, "exp": iat + ttl_s,
              "aud": USER_AUDIENCE, "iss": _issuer()}
    return jwt.encode(claims, get_settings().jwt_secret, algorithm="HS256")


def mint_agent_token(org: str, run_id: str, ttl_s: int = AGENT_TOKEN_MAX_TTL_S) -> str:
    import jwt

    if ttl_s > AGENT_TOKEN_MAX_TTL_S:
        raise ValueError(f"an agent token's lifetime may be at most {AGENT_TOKEN_MAX_TTL_S} s")
    iat = int(now_ts())
    claims = {"sub": f"agent:{run_id}", "org": org, "run": run_id, "typ": "agent", "iat": iat, "exp": iat + ttl_s,
              "aud": AGENT_AUDIENCE, "iss": _issuer(), "jti": base64.urlsafe_b64encode(os.urandom(12)).decode()}
    token = jwt.encode(claims, get_settings().jwt_secret, algorithm="HS256")
    register_secret(token)  # masked in logs and in any provider error text that echoes it
    return token


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _claim(claims: dict[str, Any], name: str, pattern: re.Pattern[str]) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise Unauthorized(f"the bearer token's {name} claim is missing or malformed")
    return value


def _decode(ctx: Context, header: str | None, audience: str, typ: str, max_ttl_s: int,
            wrong_kind: type[Unauthorized] | type[Forbidden] = Unauthorized, *,
            allow_expired: bool = False) -> dict[str, Any]:
    """Verify signature, audience, issuer and every claim's type and shape; never a 500.

    `wrong_kind`: the error for a valid token of the other kind (user vs agent). `allow_expired`: only the
    expiry is not checked (the restart exchange, whose own rules bound what an expired token gets)."""
    if not header or not header.lower().startswith("bearer "):
        raise Unauthorized("send Authorization: Bearer <token> (mint one with `tensorant dev-token`)")
    token = header.split(" ", 1)[1].strip()
    claims, previous_key = _verified(token, audience, wrong_kind)
    if not isinstance(claims, dict) or claims.get("typ") != typ:
        raise wrong_kind(f"this endpoint needs a {typ} token")
    iat = _check_times(claims, max_ttl_s, allow_expired)
    _claim(claims, "org", ORG_RE)
    _claim(claims, "sub", SUB_RE)
    # The previous key is kept so tokens issued before the rotation keep working; it was rotated out
    # because it may have leaked, so one issued once the new key was seen was forged with it. (A forger
    # can backdate iat, but the lifetime bound then ends it user_token_max_ttl after the rotation.)
    if previous_key and typ == "user" and iat >= current_key_since(ctx):
        raise Unauthorized("the bearer token is signed with a key that was rotated out and was issued after "
                           "the rotation; mint a new one")
    claims["_raw"] = token
    claims["_previous_key"] = previous_key
    return claims


def _verified(token: str, audience: str, wrong_kind: type[Unauthorized] | type[Forbidden]
              ) -> tuple[dict[str, Any], bool]:
    """The token's claims once its signature (by the current key or the previous one), audience and issuer are
    verified; and whether the previous key signed it."""
    import jwt

    settings = get_settings()
    secrets_ = [settings.jwt_secret, *([settings.jwt_secret_previous] if settings.jwt_secret_previous else [])]
    try:
        for i, secret in enumerate(secrets_):
            try:
                # exp is checked below against the control plane's clock (tests simulate it).
                claims: dict[str, Any] = jwt.decode(
                    token, secret, algorithms=["HS256"], audience=audience, issuer=_issuer(),
                    options={"verify_exp": False, "verify_iat": False, "require": ["exp", "iat", "aud", "iss"]},
                )
                break
            except jwt.InvalidSignatureError:
                if i == len(secrets_) - 1:
                    raise
        return claims, i > 0
    except jwt.InvalidSignatureError as exc:
        raise Unauthorized("the bearer token's signature does not match this control plane's key (a token from "
                           "another deployment, or signed with a key that was rotated out)") from exc
    except jwt.InvalidAudienceError as exc:
        wanted = "a user token" if audience == USER_AUDIENCE else "this run's agent token"
        raise wrong_kind(f"this endpoint needs {wanted}") from exc
    except jwt.PyJWTError as exc:
        raise Unauthorized(f"the bearer token is invalid ({type(exc).__name__})") from exc


def _check_times(claims: dict[str, Any], max_ttl_s: int, allow_expired: bool) -> float:
    """The token's lifetime within max_ttl_s, issued in the past, not expired (unless allowed): its iat."""
    if not _number(claims.get("exp")) or not _number(claims.get("iat")):
        raise Unauthorized("the bearer token's exp and iat claims must be numbers")
    exp, iat = float(claims["exp"]), float(claims["iat"])
    if exp - iat > max_ttl_s:
        raise Unauthorized(f"the bearer token's lifetime is over the {max_ttl_s} s allowed; mint a shorter one")
    if iat > now_ts() + CLOCK_SKEW_S:
        raise Unauthorized("the bearer token was issued in the future")
    if exp < now_ts() and not allow_expired:
        raise Unauthorized("the bearer token has expired; mint a new one")
    return iat


def authenticate(ctx: Context, header: str | None) -> Principal:
    claims = _decode(ctx, header, USER_AUDIENCE, "user", ctx.settings.user_token_max_ttl)
    role = claims.get("role")
    if not isinstance(role, str) or role not in Role.__members__:
        raise Unauthorized("the bearer token lacks a known role")
    return Principal(sub=claims["sub"], org=claims["org"], role=Role(role))


@dataclass(frozen=True)
class AgentToken:
    org: str
    expires_at: float  # the token's exp (heartbeats renew it when half its life is gone)
    previous_key: bool = False  # signed with TENSORANT_JWT_SECRET_PREVIOUS: renew it at once
    issued_at: float = 0.0  # the token's iat (a previous-key token issued after the rotation is not renewed)


def verify_agent(ctx: Context, header: str | None, run_id: str, *, allow_expired: bool = False) -> AgentToken:
    """A token minted for exactly this run: its org and expiry (one verification). `allow_expired`: for
    the restart exchange only (shared/services/api/boot.py exchange_restart); nothing else is relaxed."""
    claims = _decode(ctx, header, AGENT_AUDIENCE, "agent", AGENT_TOKEN_MAX_TTL_S, wrong_kind=Forbidden,
                     allow_expired=allow_expired)
    run = _claim(claims, "run", RUN_RE)
    if run != run_id:
        raise Forbidden("this token is not the token of this run")
    return AgentToken(org=str(claims["org"]), expires_at=float(claims["exp"]), previous_key=claims["_previous_key"],
                      issued_at=float(claims["iat"]))


def signed_agent_claims(header: str | None) -> dict[str, Any] | None:
    """The claims of an agent token whose signature (current or previous key), audience and issuer
    verify, whatever else is wrong with it (expired, too long-lived); None for anything else. For
    noting a refusal on a run: a token nobody can forge, so a note cannot be written by a stranger."""
    import jwt

    if not header or not header.lower().startswith("bearer "):
        return None
    settings = get_settings()
    for secret in [settings.jwt_secret, *([settings.jwt_secret_previous] if settings.jwt_secret_previous else [])]:
        try:
            claims = jwt.decode(header.split(" ", 1)[1].strip(), secret, algorithms=["HS256"],
                                audience=AGENT_AUDIENCE, issuer=_issuer(),
                                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False})
        except jwt.PyJWTError:
            continue
        return claims if isinstance(claims, dict) and claims.get("typ") == "agent" else None
    return None


def require(principal: Principal, *roles: Role) -> None:
    if principal.role not in roles:
        wanted = " or ".join(r.value for r in roles)
        raise Forbidden(f"this needs the {wanted} role; your token has {principal.role.value}")


# ---------------------------------------------------------------- sealing


def seal(data: dict[str, Any], aad: str) -> str:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    ct = AESGCM(get_settings().encryption_key_bytes).encrypt(nonce, json.dumps(data).encode(), aad.encode())
    return "v1." + base64.b64encode(nonce + ct).decode()


class SealedSecretError(Conflict):
    """A sealed secret that does not open: another row's (org|slot is the associated data),
    another encryption key, or damaged. Answered as 409 with what to do."""


def unseal(blob: str, aad: str) -> dict[str, Any]:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    what = aad.split("|", 1)[-1]
    fix = f"an owner saves the {what} connection again with its credentials"
    if not isinstance(blob, str) or not blob.startswith("v1."):
        raise SealedSecretError(f"the saved secret of {what} is in an unknown format; {fix}")
    try:
        raw = base64.b64decode(blob[3:], validate=True)
        plain = AESGCM(get_settings().encryption_key_bytes).decrypt(raw[:12], raw[12:], aad.encode())
        result: dict[str, Any] = json.loads(plain)
    except (InvalidTag, ValueError) as exc:
        # The org and slot are the associated data: a blob copied from another org's (or
        # another slot's) row fails here, as does one sealed under another key.
        raise SealedSecretError(f"the saved secret of {what} does not open for this organization (it was sealed "
                                f"for another row or with another encryption key); {fix}") from exc
    return result
