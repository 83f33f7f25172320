"""Key rotation cannot launder a forged token: a token signed with the rotated-out key is renewed onto the
new key only if it was issued before the new key was first seen and not before its run was launched, and a
renewal never widens the token's org or run (shared/key_rotation.py)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator

import pytest

from shared.security import AGENT_AUDIENCE, _issuer
from shared.settings import get_settings, reset_settings
from tests.fakes import Cloud
from tests.harness import Harness

NEW_SECRET = "rotated-secret-" + "q" * 40


@pytest.fixture
def rotate(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    def to_new_key(*, keep_previous: bool) -> str:
        old = get_settings().jwt_secret
        monkeypatch.setenv("TENSORANT_JWT_SECRET", NEW_SECRET)
        if keep_previous:
            monkeypatch.setenv("TENSORANT_JWT_SECRET_PREVIOUS", old)
        else:
            monkeypatch.delenv("TENSORANT_JWT_SECRET_PREVIOUS", raising=False)
        reset_settings()
        return old

    yield to_new_key
    reset_settings()


def forge(secret: str, org: str, run_id: str, iat: int, ttl_s: int = 3600) -> str:
    import jwt

    return jwt.encode({"sub": f"agent:{run_id}", "org": org, "run": run_id, "typ": "agent", "iat": iat,
                       "exp": iat + ttl_s, "aud": AGENT_AUDIENCE, "iss": _issuer(),
                       "jti": base64.urlsafe_b64encode(os.urandom(12)).decode()}, secret, algorithm="HS256")


def beat(harness: Harness, run_id: str, token: str) -> tuple[int, dict[str, object]]:
    status, body, _ = harness.call("POST", f"/api/agent/runs/{run_id}/heartbeat", token=token,
                             json_body={"phase": "training", "progress": 0.5})
    return status, body


def test_a_token_forged_with_the_rotated_out_key_is_not_renewed(harness: Harness, cloud: Cloud, rotate) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=24 * 3600)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.3)
    harness.clock.advance(60)
    old = rotate(keep_previous=True)
    real = agent.heartbeat("training", 0.4)  # the real agent, first after the rotation: renewed
    assert real["token"], real
    harness.clock.advance(600)
    # The attacker holds the rotated-out key (why it was rotated) and forges a fresh token for the run.
    forged = forge(old, harness.org, run_id, int(harness.clock.t))
    status, reply = beat(harness, run_id, forged)
    assert status == 200 and "token" not in reply, reply  # accepted while the previous key is, never laundered
    # Once the previous key is removed the forged token is worth nothing, the real agent's renewed one still works.
    rotate(keep_previous=False)
    assert beat(harness, run_id, forged)[0] == 401
    assert beat(harness, run_id, str(real["token"]))[0] == 200


def test_a_previous_key_token_older_than_its_run_is_not_renewed(harness: Harness, cloud: Cloud, rotate) -> None:
    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=24 * 3600)
    harness.clock.advance(3600)
    harness.launch(run_id)
    harness.agent(run_id).heartbeat("training", 0.3)
    old = rotate(keep_previous=True)
    harness.agent(run_id).heartbeat("training", 0.4)  # the new key is seen
    # Backdated to before the launch: no real token of this run was issued then.
    backdated = forge(old, harness.org, run_id, int(harness.clock.t) - 1800)
    status, reply = beat(harness, run_id, backdated)
    assert status == 200 and "token" not in reply, reply


def test_a_renewal_keeps_the_tokens_org_and_run(harness: Harness, cloud: Cloud, rotate) -> None:
    import jwt

    run_id = harness.create_run("memory", "mem-a10", runtime_limit_s=24 * 3600)
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.3)
    rotate(keep_previous=True)
    reply = agent.heartbeat("training", 0.4)  # issued before the rotation: renewed at once
    claims = jwt.decode(str(reply["token"]), NEW_SECRET, algorithms=["HS256"], audience=AGENT_AUDIENCE)
    old = jwt.decode(agent.token, options={"verify_signature": False})
    assert {k: claims[k] for k in ("org", "run", "sub", "typ", "aud", "iss")} == \
        {k: old[k] for k in ("org", "run", "sub", "typ", "aud", "iss")}
    assert claims["exp"] - claims["iat"] == get_settings().agent_token_ttl_s


def forge_user(secret: str, org: str, iat: int, role: str = "owner", ttl_s: int = 3600) -> str:
    import jwt

    from shared.security import USER_AUDIENCE

    return jwt.encode({"sub": "mallory@x", "org": org, "role": role, "typ": "user", "iat": iat, "exp": iat + ttl_s,
                       "aud": USER_AUDIENCE, "iss": _issuer()}, secret, algorithm="HS256")


def test_a_user_token_forged_with_the_rotated_out_key_is_refused(harness: Harness, cloud: Cloud, rotate) -> None:
    harness.clock.advance(60)
    old = rotate(keep_previous=True)
    assert harness.call("GET", "/api/runs", token="member")[0] == 200  # issued before the rotation: still good
    harness.clock.advance(600)
    forged = forge_user(old, harness.org, int(harness.clock.t))
    status, body, _ = harness.call("GET", "/api/runs", token=forged)
    assert status == 401 and "rotated out" in body["detail"], body
    # Another org, owner role: the same.
    status, _, _ = harness.call("GET", "/api/runs", token=forge_user(old, "org-z", int(harness.clock.t)))
    assert status == 401
    assert harness.call("GET", "/api/runs", token=forge_user(NEW_SECRET, harness.org, int(harness.clock.t)))[0] == 200


def _exchange(harness: Harness, run_id: str, claim: str) -> tuple[int, object]:
    status, body, _ = harness.call("POST", f"/api/agent/runs/{run_id}/bootstrap", token=None, json_body={"claim": claim})
    return status, body


def test_a_claim_forged_with_the_rotated_out_key_is_refused(harness: Harness, cloud: Cloud, rotate) -> None:
    from shared.providers.bootstrap_env import CLAIM_PREFIX, _claim_mac

    before = harness.create_run("memory", "mem-a10")
    harness.launch(before)
    harness.clock.advance(60)
    old = rotate(keep_previous=True)
    harness.clock.advance(60)
    after = harness.create_run("memory", "mem-a10")
    harness.launch(after)  # minted on the new key: the new key is seen before this launch
    assert harness.get_run(after)["state"] == "provisioning"
    forged = f"{CLAIM_PREFIX}.{harness.org}.{after}.{_claim_mac(old, harness.org, after)}"
    status, body = _exchange(harness, after, forged)
    assert status == 401 and "rotated out" in json.dumps(body), body
    # A run launched before the rotation: its claim, on the previous key, is still good.
    assert harness.get_run(before)["state"] == "provisioning"
    status, body = _exchange(harness, before, f"{CLAIM_PREFIX}.{harness.org}.{before}.{_claim_mac(old, harness.org, before)}")
    assert status == 200, body


def test_a_claim_expires_at_the_boot_deadline(harness: Harness, cloud: Cloud) -> None:
    from shared.providers.bootstrap_env import claim
    from shared.store import get_store

    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    record, _ = get_store().runs.get(harness.org, run_id)
    assert record.deadlines.provisioning_by is not None
    harness.clock.t = record.deadlines.provisioning_by.timestamp() + 1  # before the sweep releases it
    status, body = _exchange(harness, run_id, claim(harness.org, run_id))
    assert status == 401 and "expired" in json.dumps(body), body
