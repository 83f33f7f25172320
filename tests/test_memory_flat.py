"""The host's memory is flat over a soak (issue 38.6: +0.60 MB/min, about 60 KB a run, over 254 runs). What a
process kept per run: every run token, presigned URL and bootstrap blob it registered as a secret to mask (an
unbounded set), and the last copy of up to 1,024 runs, ended ones included (store.runs, for heartbeats)."""

from __future__ import annotations

import secrets

from shared import log
from shared.store import get_store
from tests.fakes import Cloud
from tests.harness import Harness, smoke_adapter_zip


def test_the_secrets_to_mask_are_bounded_and_the_ones_in_use_stay() -> None:
    kept = "connection-secret-" + secrets.token_hex(8)
    log.register_secret(kept)
    bound = getattr(log, "MAX_SECRET_VALUES", 1024)
    for _ in range(3 * bound):
        log.register_secret("run-token-" + secrets.token_hex(16))
        log.register_secret(kept)  # a connection's key, registered again at each unseal
    assert len(log._SECRET_VALUES) <= bound
    assert log.redact_text(f"error: {kept} rejected") == f"error: {log.MASK} rejected"
    recent = "run-token-" + secrets.token_hex(16)
    log.register_secret(recent)
    assert recent not in log.redact_text(f"token {recent}")


def test_an_ended_run_is_not_kept_in_the_process(harness: Harness, cloud: Cloud) -> None:
    run_id = harness.create_run("memory", "mem-a10")
    harness.launch(run_id)
    agent = harness.agent(run_id)
    agent.heartbeat("training", 0.5)
    assert (harness.org, run_id) in get_store().runs._last  # an active run's copy serves its heartbeats
    agent.train(smoke_adapter_zip())
    harness.drain()
    assert harness.get_run(run_id)["state"] == "succeeded"
    assert (harness.org, run_id) not in get_store().runs._last
