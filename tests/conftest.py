"""Session fixtures: a real Azurite, a fresh table prefix per test, clean queues, a temp local root."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.azurite import Azurite


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    az = Azurite().start()
    os.environ["AzureWebJobsStorage"] = az.connection_string
    yield az
    az.stop()


@pytest.fixture
def env(azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Settings for one test: its own tables, clean queues, a temporary local root."""
    from shared import queues, settings
    from shared.store import reset_store

    values = {
        "AzureWebJobsStorage": azurite.connection_string,
        "TENSORANT_TABLE_PREFIX": "t" + secrets.token_hex(4),
        "TENSORANT_LOCAL_ROOT": str(tmp_path / "local"),
        "TENSORANT_DEPLOYMENT_ID": "test",
        # The local provider's default is the real LoRA trainer; tests run the fast smoke trainer
        # unless they unset this (tests/e2e/test_local_trainer_e2e.py).
        "TENSORANT_TRAINER_COMMAND": f"{sys.executable} -m shared.trainer.smoke",
        # Cloud tests run the test models (tensorant/*) on fake clouds; without this a cloud run refuses
        # them (tests/test_training_api.py checks that refusal with the setting off).
        "TENSORANT_ALLOW_TEST_MODELS": "1",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    settings.reset_settings()
    reset_store()
    queues.reset_queues()
    queues.get_queues().clear_all()
    yield values
    try:
        from shared.store import get_store

        get_store().drop_all()
    except Exception:
        pass
    settings.reset_settings()
    reset_store()
    queues.reset_queues()
