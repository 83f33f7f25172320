"""The control-plane Bicep template sets every app setting the app needs in production."""

from __future__ import annotations

import re
from pathlib import Path

from shared.settings import _ENV

BICEP = Path(__file__).resolve().parent.parent / "infra" / "controlplane" / "main.bicep"
# Settings with a safe default in production need not be set by the template.
REQUIRED_IN_PRODUCTION = {"env", "storage_connection", "deployment_id", "jwt_secret", "encryption_key", "public_url"}


def test_bicep_sets_every_required_setting() -> None:
    text = BICEP.read_text()
    set_here = set(re.findall(r"^\s+(\w+):", text, flags=re.M))
    missing = {_ENV[field] for field in REQUIRED_IN_PRODUCTION} - set_here
    assert not missing, f"infra/controlplane/main.bicep does not set {sorted(missing)}"
    assert "TENSORANT_ENV: 'production'" in text


def test_secrets_come_from_key_vault_not_plain_settings() -> None:
    text = BICEP.read_text()
    for setting in ("TENSORANT_JWT_SECRET", "TENSORANT_ENCRYPTION_KEY"):
        line = next(line for line in text.splitlines() if line.strip().startswith(setting + ":"))
        assert "@Microsoft.KeyVault(" in line
