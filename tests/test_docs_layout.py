"""docs/architecture.md's map stays true (issue 32.10): every file its "Where each thing lives" table names
exists, and every module of the folders it maps is named there, so a file added, moved or removed without
the map fails here instead of misleading the next reader.

The table's conventions, which this reads: a row's first cell names its paths in backticks (a folder ends
in `/`); the second cell names files in backticks, relative to the row's folder or any folder below it
(`main.py`, `runs/`), or from the repository root (`tests/test_layers.py`); `{a,b}` stands for each name,
`<cloud>` for any provider package."""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
# The folders whose every module the table must name (package markers aside).
MAPPED = ["machine/agent", "machine/trainer", "tools/cli/tensorant_cli", "tools/client/tensorant_client",
          "tools/devhost/tensorant_devhost",
          "adapter_format", *sorted(str(p.parent.relative_to(ROOT)) for p in ROOT.glob("shared/*/__init__.py"))]
MARKERS = {"__init__.py", "__main__.py"}
PATH_LIKE = re.compile(r"^[\w.<>{},*/-]+$")
FILE_SUFFIXES = (".py", ".sh", ".json", ".md", ".yml", ".yaml", ".txt", ".toml", ".bicep", ".in")


@dataclass(frozen=True)
class Row:
    paths: list[str]  # the first cell's backticked paths
    text: str  # the whole row

    @property
    def folders(self) -> list[Path]:
        """The folders the row is about: its folders, and the folder of each file it names."""
        out = []
        for p in self.paths:
            path = ROOT / p.rstrip("/")
            out.append(path if p.endswith("/") or path.is_dir() else path.parent)
        return out

    def names(self) -> list[str]:
        """The row's path-like names, braces expanded, `<cloud>` as a wildcard."""
        out = []
        for token in re.findall(r"`([^`]+)`", self.text):
            if not PATH_LIKE.match(token) or token.startswith("/"):
                continue  # a command, a setting, an API path
            if "/" not in token and not token.endswith(FILE_SUFFIXES) and token != "Dockerfile":
                continue  # a function or a field (`claim_launch`, `walk`)
            out += [name.replace("<cloud>", "*") for name in _expand(token)]
        return out


def _expand(token: str) -> list[str]:
    match = re.search(r"\{([^{}]+)\}", token)
    if not match:
        return [token]
    return [x for part in match.group(1).split(",")
            for x in _expand(token[:match.start()] + part.strip() + token[match.end():])]


def rows() -> list[Row]:
    text = DOC.read_text()
    assert "## Where each thing lives" in text, "docs/architecture.md has no 'Where each thing lives' section"
    section = text.split("## Where each thing lives", 1)[1].split("\n## ", 1)[0]
    out, pending = [], ""
    for line in section.splitlines():
        if not pending and not line.startswith("| `"):
            continue  # the header, its rule, the prose around the table
        pending = f"{pending} {line}" if pending else line
        if pending.rstrip().endswith("|"):  # a cell may run over several lines
            cells = pending.strip().strip("|").split(" | ", 1)
            assert len(cells) == 2, f"a row of the table is not `path | what`: {pending[:120]}"
            out.append(Row(re.findall(r"`([^`]+)`", cells[0]), pending))
            pending = ""
    assert len(out) > 10, "the table was not read"
    return out


def _resolves(name: str, folders: list[Path]) -> bool:
    pattern = name.rstrip("/")
    if any(ROOT.glob(pattern)):
        return True
    # Below one of the row's folders, at any depth (never from the root: .venv and node_modules are there).
    return any(any(folder.glob(pattern)) or any(folder.glob(f"**/{pattern}")) for folder in folders if folder.is_dir())


def test_every_path_the_table_names_exists() -> None:
    missing = []
    for row in rows():
        for path in row.paths:
            if not (ROOT / path.rstrip("/")).exists():
                missing.append(f"{path} (the first cell of its row)")
        for name in row.names():
            if not _resolves(name, row.folders):
                missing.append(f"{name} (in the row of {', '.join(row.paths)})")
    assert not missing, "docs/architecture.md names files that do not exist:\n  " + "\n  ".join(missing)


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if p.name not in MARKERS and "__pycache__" not in p.parts)


def _row_of(module: Path, table: list[Row]) -> tuple[Row, Path] | None:
    """The row whose folder holds the module most closely, and that folder."""
    best: tuple[Row, Path] | None = None
    for row in table:
        for folder in row.folders:
            if folder != ROOT and module.is_relative_to(folder) and (best is None or len(folder.parts) > len(best[1].parts)):
                best = (row, folder)
    return best


def _named(module: Path, row: Row, folder: Path) -> bool:
    rel = str(module.relative_to(folder))
    return any(fnmatch.fnmatch(rel, name) or fnmatch.fnmatch(rel, f"*/{name}") for name in row.names())


def test_every_module_of_a_mapped_folder_is_named() -> None:
    table = rows()
    unnamed = []
    for folder in MAPPED:
        assert (ROOT / folder).is_dir(), f"{folder} is gone: update MAPPED and the table"
        for module in _modules(folder):
            found = _row_of(module, table)
            where = module.relative_to(ROOT)
            if found is None:
                unnamed.append(f"{where} (no row maps its folder)")
            elif not _named(module, *found):
                unnamed.append(f"{where} (not named in the row of {', '.join(found[0].paths)})")
    assert not unnamed, ("docs/architecture.md's 'Where each thing lives' does not name these modules: add each "
                         "to its row in backticks, saying what it is for:\n  " + "\n  ".join(unnamed))


def test_the_reader_sees_a_module_left_out(tmp_path: Path) -> None:
    # The check above could pass by matching everything: a module the table does not name is not named.
    table = rows()
    row_folder = _row_of(ROOT / "machine/agent/not_in_the_table.py", table)
    assert row_folder is not None and row_folder[1] == ROOT / "machine/agent"
    assert not _named(ROOT / "machine/agent/not_in_the_table.py", *row_folder)
    assert _named(ROOT / "machine/agent/heartbeat.py", *row_folder)
    assert not _resolves("no_such_module.py", row_folder[0].folders)


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
    return found


def test_a_handler_imports_no_vendor_sdk() -> None:
    # The map's first rule: a handler in functions/ parses, calls a service and answers; a cloud or storage
    # SDK is the services' and the providers' (lazily). Imports inside functions count too.
    allowed_top = {"shared", "azure"} | set(sys.stdlib_module_names)
    found = []
    for path in sorted((ROOT / "functions").glob("*.py")):
        for module in _imports(path):
            top = module.split(".")[0]
            if top not in allowed_top or (top == "azure" and module != "azure.functions"):
                found.append(f"functions/{path.name}: {module}")
    assert not found, "a handler imports a vendor SDK:\n  " + "\n  ".join(found)
