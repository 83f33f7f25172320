"""README's settings table and local.settings.example.json, written from shared/settings.py.

    python -m tools.settings_doc           write both (`make settings-doc`)
    python -m tools.settings_doc --check   exit 1, naming what differs, without writing

shared/settings.py is the one place a setting is declared (its field, default, description and
environment name); these two files only repeat it, so they are generated and
tests/test_settings_doc.py checks them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shared.settings import EXAMPLE_VALUES, SHOWN_DEFAULTS, Settings, environment_names

ROOT = Path(__file__).resolve().parent.parent
README = "README.md"
EXAMPLE = "local.settings.example.json"
BEGIN = "<!-- settings:begin: `make settings-doc` writes this table from shared/settings.py -->"
END = "<!-- settings:end -->"
# The Functions host's own settings that a local host needs (Core Tools' `func start`); the app
# reads neither.
HOST_VALUES = {"FUNCTIONS_WORKER_RUNTIME": "python", "AzureWebJobsFeatureFlags": "EnableWorkerIndexing"}


def _shown_default(name: str, default: Any) -> str:
    if name in SHOWN_DEFAULTS:
        return SHOWN_DEFAULTS[name]
    if isinstance(default, bool):
        return "on" if default else "off"
    if default == "":
        return "unset"
    if isinstance(default, int):
        return str(default)
    return f"`{default}`"


def _example_value(name: str, default: Any) -> str:
    # local.settings.json Values are strings; load_settings parses them back into the field's type.
    if name in EXAMPLE_VALUES:
        return EXAMPLE_VALUES[name]
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


def table() -> str:
    """README's settings table, one row per setting in declaration order."""
    env = environment_names()
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for name, info in Settings.model_fields.items():
        meaning = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{env[name]}` | {_shown_default(name, info.default)} | {meaning} |")
    return "\n".join(rows) + "\n"


def example() -> str:
    """local.settings.example.json: the host's settings, then every app setting."""
    env = environment_names()
    values = dict(HOST_VALUES)
    values.update({env[name]: _example_value(name, info.default) for name, info in Settings.model_fields.items()})
    return json.dumps({"IsEncrypted": False, "Values": values}, indent=2) + "\n"


def readme_with_table(readme: str) -> str:
    """README's text with the table between the markers replaced by table()."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{README} has no settings table markers ({BEGIN} ... {END})")
    return readme[:start + len(BEGIN)] + "\n" + table() + readme[end:]


def expected(root: Path) -> dict[Path, str]:
    """Each generated file and the text it should hold."""
    return {root / README: readme_with_table((root / README).read_text()), root / EXAMPLE: example()}


def outdated(root: Path = ROOT) -> list[Path]:
    return [path for path, text in expected(root).items() if not path.exists() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.settings_doc", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the files match shared/settings.py")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    stale = outdated(args.root)
    if args.check:
        for path in stale:
            print(f"{path.name} differs from shared/settings.py: run `make settings-doc`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in expected(args.root).items():
        if path in stale:
            path.write_text(text)
            print(f"wrote {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
