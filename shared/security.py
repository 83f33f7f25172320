"""Bearer JWTs for users and agents, and AES-GCM sealing of connection secrets."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any

from shared.clock import now_ts
from shared.errors import Forbidden, Unauthorized
from shared.log import register_secret
from shared.models import Role
from shared.settings import get_settings


@dataclass(frozen=True)
class Principal:
    sub: str
    org: str
    role: Role


def mint_user_token(sub: str, org: str, role: Role, ttl_s: int = 12 * 3600) -> str:
    import jwt

    iat = int(now_ts())
    claims = {"sub": sub, "org": org, "role": role.value, "typ": "user", "iat": iat, "exp": iat + ttl_s}
    return jwt.encode(claims, get_settings().jwt_secret, algorithm="HS256")


def mint_agent_token(org: str, run_id: str, ttl_s: int = 8 * 24 * 3600) -> str:
    import jwt

    iat = int(now_ts())
    claims = {"sub": f"agent:{run_id}", "org": org, "run": run_id, "typ": "agent", "iat": iat, "exp": iat + ttl_s,
              "jti": base64.urlsafe_b64encode(os.urandom(12)).decode()}
    token = jwt.encode(claims, get_settings().jwt_secret, algorithm="HS256")
    register_secret(token)  # masked in logs and in any provider error text that echoes it
    return token


def _decode(header: str | None) -> dict[str, Any]:
    import jwt

    if not header or not header.lower().startswith("bearer "):
        raise Unauthorized("send Authorization: Bearer <token> (mint one with `tensorant dev-token`)")
    token = header.split(" ", 1)[1].strip()
    try:
        claims: dict[str, Any] = jwt.decode(
            token, get_settings().jwt_secret, algorithms=["HS256"], options={"verify_exp": False}
        )
    except jwt.PyJWTError as exc:
        raise Unauthorized(f"the bearer token is invalid ({type(exc).__name__})") from exc
    if claims.get("exp", 0) < now_ts():
        raise Unauthorized("the bearer token has expired; mint a new one")
    claims["_raw"] = token
    return claims


def authenticate(header: str | None) -> Principal:
    claims = _decode(header)
    if claims.get("typ") != "user":
        raise Unauthorized("this endpoint needs a user token, not an agent token")
    try:
        return Principal(sub=str(claims["sub"]), org=str(claims["org"]), role=Role(claims["role"]))
    except (KeyError, ValueError) as exc:
        raise Unauthorized("the bearer token lacks sub, org or a known role") from exc


def authenticate_agent(header: str | None, run_id: str) -> str:
    """Return the org of a token minted for exactly this run."""
    claims = _decode(header)
    if claims.get("typ") != "agent" or claims.get("run") != run_id:
        raise Forbidden("this token is not the token of this run")
    return str(claims["org"])


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


def unseal(blob: str, aad: str) -> dict[str, Any]:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not blob.startswith("v1."):
        raise ValueError("unknown sealed format")
    raw = base64.b64decode(blob[3:])
    plain = AESGCM(get_settings().encryption_key_bytes).decrypt(raw[:12], raw[12:], aad.encode())
    result: dict[str, Any] = json.loads(plain)
    return result
