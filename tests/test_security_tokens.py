"""Token claims by pattern, audiences, lifetimes, production settings."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import jwt
import pytest

from shared import settings as settings_mod
from shared.clock import now_ts
from shared.context import invocation
from shared.errors import Forbidden, Unauthorized
from shared.models import Role
from shared.security import authenticate, mint_agent_token, mint_user_token, verify_agent
from shared.settings import get_settings, load_settings, reset_settings
from tests.harness import Harness

GOOD_SECRET = "s" * 40
GOOD_KEY = base64.b64encode(b"k" * 32).decode()


def _token(**over: Any) -> str:
    """A correctly signed user token with the given claims changed (None removes one)."""
    iat = int(now_ts())
    s = get_settings()
    claims: dict[str, Any] = {"sub": "eve@b", "org": "org-a", "role": "owner", "typ": "user", "iat": iat,
                              "exp": iat + 3600, "aud": "tensorant-api", "iss": f"tensorant:{s.deployment_id}"}
    claims.update(over)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, s.jwt_secret, algorithm="HS256")


@pytest.mark.parametrize("claims", [
    {"exp": "never"}, {"exp": None}, {"exp": True}, {"iat": "x"},
    {"org": ""}, {"org": 7}, {"org": ["org-a", "org-b"]}, {"org": None}, {"org": {"x": 1}}, {"org": "Org/A"},
    {"org": "org-a\u2028"}, {"org": "org-a\n"}, {"sub": "eve\n"},
    {"sub": ""}, {"sub": ["a"]}, {"sub": "a" * 300}, {"role": "root"}, {"role": ["owner"]},
    {"typ": "agent"}, {"typ": None}, {"aud": None}, {"aud": "tensorant-agent"}, {"iss": "someone-else"},
    # Tokens shaped like the ones minted before audiences existed: 500 and "every org" before the fix.
    {"exp": "never", "aud": None, "iss": None}, {"org": "", "aud": None, "iss": None},
    {"org": ["org-a"], "aud": None, "iss": None},
], ids=lambda c: repr(c)[:40])
def test_bad_claims_are_401_never_500(harness: Harness, claims: dict[str, Any]) -> None:
    status, body, headers = harness.call("GET", "/api/runs", token=_token(**claims))
    assert status == 401, body
    assert headers["Content-Type"] == "application/problem+json"


def test_user_token_refused_on_agent_api_and_agent_token_on_user_api(harness: Harness) -> None:
    user = mint_user_token("m@a", "org-a", Role.member)
    with pytest.raises(Forbidden):
        verify_agent(invocation(), f"Bearer {user}", "r-1")
    # Even with typ and run forged to look like an agent token, the audience differs.
    forged = _token(typ="agent", run="r-1", sub="agent:r-1")
    with pytest.raises(Forbidden, match="agent token"):
        verify_agent(invocation(), f"Bearer {forged}", "r-1")
    agent = mint_agent_token("org-a", "r-1")
    with pytest.raises(Unauthorized):
        authenticate(invocation(), f"Bearer {agent}")
    assert verify_agent(invocation(), f"Bearer {agent}", "r-1").org == "org-a"
    assert authenticate(invocation(), f"Bearer {user}").org == "org-a"


def test_token_from_another_deployment_is_refused(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    token = mint_user_token("m@a", "org-a", Role.member)
    monkeypatch.setenv("TENSORANT_DEPLOYMENT_ID", "other")
    reset_settings()
    with pytest.raises(Unauthorized):
        authenticate(invocation(), f"Bearer {token}")


@pytest.fixture
def production(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TENSORANT_ENV", "production")
    monkeypatch.setenv("TENSORANT_JWT_SECRET", GOOD_SECRET)
    monkeypatch.setenv("TENSORANT_ENCRYPTION_KEY", GOOD_KEY)
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", "https://tensorant-prod.azurewebsites.net")
    monkeypatch.delenv("TENSORANT_ALLOW_TEST_MODELS")  # a test-only allowance production refuses
    reset_settings()
    yield
    reset_settings()


def test_production_caps_user_token_lifetime(production: None) -> None:
    iat = int(now_ts())
    long_lived = _token(iat=iat, exp=iat + 10 * 365 * 86400)
    with pytest.raises(Unauthorized, match="lifetime"):
        authenticate(invocation(), f"Bearer {long_lived}")
    with pytest.raises(ValueError, match="lifetime"):
        mint_user_token("a@b", "org-a", Role.admin, ttl_s=10 * 365 * 86400)
    ok = mint_user_token("a@b", "org-a", Role.owner, ttl_s=3600)
    assert authenticate(invocation(), f"Bearer {ok}").role == Role.owner


@pytest.mark.parametrize("spelling", ["production", "Production", "PRODUCTION", " production "])
@pytest.mark.parametrize("bad", [
    {"TENSORANT_JWT_SECRET": "x"},
    {"TENSORANT_JWT_SECRET": "replace-with-a-long-random-secret"},
    {"TENSORANT_JWT_SECRET": settings_mod.DEV_JWT_SECRET},
    {"TENSORANT_JWT_SECRET": "a" * 31},
    {"TENSORANT_ENCRYPTION_KEY": "replace-with-base64-of-32-random-bytes"},
    {"TENSORANT_ENCRYPTION_KEY": base64.b64encode(b"short").decode()},
    {"TENSORANT_ENCRYPTION_KEY": settings_mod.DEV_ENCRYPTION_KEY},
    {"TENSORANT_ALLOW_PRIVATE_ENDPOINTS": "1"},
    {"TENSORANT_ALLOW_TEST_MODELS": "1"},
    {"TENSORANT_JWT_SECRET_PREVIOUS": "too-short"},
    {"TENSORANT_JWT_SECRET_PREVIOUS": settings_mod.DEV_JWT_SECRET},
    {"TENSORANT_USER_TOKEN_MAX_TTL_S": str(30 * 86400)},
    {"TENSORANT_PUBLIC_URL": "http://tensorant-prod.azurewebsites.net"},  # agents' tokens in clear text
    {"TENSORANT_PUBLIC_URL": "HTTP://tensorant-prod.azurewebsites.net"},
], ids=lambda b: repr(b)[:50])
def test_production_refuses_weak_settings_at_start(monkeypatch: pytest.MonkeyPatch, spelling: str,
                                                   bad: dict[str, str]) -> None:
    monkeypatch.setenv("TENSORANT_ENV", spelling)
    monkeypatch.setenv("TENSORANT_JWT_SECRET", GOOD_SECRET)
    monkeypatch.setenv("TENSORANT_ENCRYPTION_KEY", GOOD_KEY)
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", "https://tensorant-prod.azurewebsites.net")
    for k, v in bad.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match="production"):
        load_settings()


def test_production_accepts_strong_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORANT_ENV", "Production")
    monkeypatch.setenv("TENSORANT_JWT_SECRET", GOOD_SECRET)
    monkeypatch.setenv("TENSORANT_ENCRYPTION_KEY", GOOD_KEY)
    monkeypatch.setenv("TENSORANT_PUBLIC_URL", "https://tensorant-prod.azurewebsites.net")
    s = load_settings()
    assert s.env == "production" and s.is_production
    assert s.user_token_max_ttl == 24 * 3600


@pytest.mark.parametrize("name", ["prod", "production\u200b", "staging", "dev"])
def test_an_unknown_environment_name_is_refused_at_start(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # Not silently "development" (which skips every production check).
    monkeypatch.setenv("TENSORANT_ENV", name)
    with pytest.raises(ValueError, match="TENSORANT_ENV must be one of production, development, test"):
        load_settings()


@pytest.mark.parametrize("var", ["TENSORANT_JWT_SECRET", "TENSORANT_ENCRYPTION_KEY", "AzureWebJobsStorage"])
def test_an_unresolved_key_vault_reference_is_refused_as_a_secret(monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    monkeypatch.setenv(var, "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/jwt/)")
    with pytest.raises(ValueError, match="Key Vault reference was not resolved"):
        load_settings()


def test_a_platform_admin_acts_on_queues_not_on_an_orgs_data(env: dict[str, str]) -> None:
    from tests.harness import Harness

    h = Harness()
    try:
        for method, path in (("GET", "/api/runs"), ("GET", "/api/connections/storage"), ("POST", "/api/projects"),
                             ("GET", "/api/org/limits")):
            status, body, _ = h.call(method, path, token="admin", json_body={"name": "x"} if method == "POST" else None)
            assert status == 403 and "platform admin" in body["detail"], (path, body)
        assert h.ok("GET", "/api/platform/queues", token="admin")  # its own routes still work
    finally:
        h.close()
