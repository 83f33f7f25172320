"""README's settings table and local.settings.example.json agree with shared/settings.py.

Both are written by `make settings-doc` (tools/settings_doc.py); a setting added, removed or
re-described in shared/settings.py without running it fails here.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from shared.settings import (
    EXAMPLE_ENCRYPTION_KEY,
    EXAMPLE_JWT_SECRET,
    Settings,
    environment_names,
    load_settings,
    production_problems,
)
from tools import settings_doc

ROOT = Path(__file__).resolve().parent.parent


def _table_names(readme: str) -> list[str]:
    block = readme[readme.index(settings_doc.BEGIN):readme.index(settings_doc.END)]
    return re.findall(r"^\| `([A-Za-z_]+)` \|", block, re.M)


def test_readme_and_the_example_file_are_what_make_settings_doc_writes() -> None:
    stale = [p.name for p in settings_doc.outdated(ROOT)]
    assert stale == [], f"{stale} differ from shared/settings.py: run `make settings-doc`"


def test_every_setting_has_a_row_and_an_example_value() -> None:
    names = list(environment_names().values())
    assert len(names) == len(Settings.model_fields) > 20
    assert _table_names((ROOT / "README.md").read_text()) == names
    values = json.loads((ROOT / "local.settings.example.json").read_text())["Values"]
    assert [k for k in values if k not in settings_doc.HOST_VALUES] == names
    assert all(isinstance(v, str) for v in values.values())  # the Functions host takes strings only


def test_check_fails_on_a_stale_copy_and_the_generator_repairs_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("README.md", "local.settings.example.json"):
        shutil.copy(ROOT / name, tmp_path / name)
    readme = tmp_path / "README.md"
    readme.write_text(re.sub(r"^\| `TENSORANT_AGENT_TOKEN_TTL_S` .*\n", "", readme.read_text(), flags=re.M))
    assert "TENSORANT_AGENT_TOKEN_TTL_S" not in _table_names(readme.read_text())

    assert settings_doc.main(["--check", "--root", str(tmp_path)]) == 1
    assert "README.md differs" in capsys.readouterr().err
    assert settings_doc.main(["--root", str(tmp_path)]) == 0
    assert settings_doc.main(["--check", "--root", str(tmp_path)]) == 0
    assert readme.read_text() == (ROOT / "README.md").read_text()


def test_a_readme_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        settings_doc.readme_with_table("# no table here\n")


def test_the_example_file_loads_as_the_defaults_with_placeholder_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    values = json.loads((ROOT / "local.settings.example.json").read_text())["Values"]
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    loaded = load_settings()
    assert loaded == Settings(jwt_secret=EXAMPLE_JWT_SECRET, encryption_key=EXAMPLE_ENCRYPTION_KEY)
    # Copied into a production deployment as it is, it does not start.
    problems = production_problems(loaded.model_copy(update={"env": "production"}))
    assert any("TENSORANT_JWT_SECRET " in p for p in problems)
    assert any("TENSORANT_ENCRYPTION_KEY" in p for p in problems)
