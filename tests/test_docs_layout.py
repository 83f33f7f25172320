"""docs/architecture.md stays true and short (issues 32.10 and 44.10).

Its map: every file the "Where each thing lives" tables name exists, and every module of the folders they
map is named there, so a file added, moved or removed without the map fails here. Its rules: every
`tests/<file>.py::<test>` the page cites exists. Its size: one sitting (at most MAX_WORDS words, sentences
of at most MAX_MEAN_SENTENCE words on average).

The tables' conventions, which this reads: a row's first cell names its paths in backticks, from the
repository root (a folder ends in `/`); the second cell names files in backticks, relative to the row's
folder or any folder below it (`main.py`, `runs/`), or from the repository root; `{a,b}` stands for each
name, `<cloud>` for any provider package. A row's folder is the folder it names, or the folder of the file
it names."""

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


def _rows_of(module: Path, table: list[Row]) -> list[tuple[Row, Path]]:
    """Each row whose folder holds the module, with that folder."""
    return [(row, folder) for row in table for folder in row.folders
            if folder != ROOT and module.is_relative_to(folder)]


def _named(module: Path, row: Row, folder: Path) -> bool:
    rel, from_root = str(module.relative_to(folder)), str(module.relative_to(ROOT))
    return any(fnmatch.fnmatch(rel, name) or fnmatch.fnmatch(rel, f"*/{name}") or fnmatch.fnmatch(from_root, name)
               for name in row.names())


def test_every_module_of_a_mapped_folder_is_named() -> None:
    table = rows()
    unnamed = []
    for folder in MAPPED:
        assert (ROOT / folder).is_dir(), f"{folder} is gone: update MAPPED and the table"
        for module in _modules(folder):
            holders = _rows_of(module, table)
            where = module.relative_to(ROOT)
            if not holders:
                unnamed.append(f"{where} (no row maps its folder)")
            elif not any(_named(module, *holder) for holder in holders):
                unnamed.append(f"{where} (not named in a row of {holders[-1][1].relative_to(ROOT)})")
    assert not unnamed, ("docs/architecture.md's 'Where each thing lives' does not name these modules: add each "
                         "to its row in backticks, saying what it is for:\n  " + "\n  ".join(unnamed))


def test_the_reader_sees_a_module_left_out(tmp_path: Path) -> None:
    # The check above could pass by matching everything: a module the table does not name is not named.
    table = rows()
    left_out, kept = ROOT / "machine/agent/not_in_the_table.py", ROOT / "machine/agent/heartbeat.py"
    holders = _rows_of(left_out, table)
    assert holders and all(folder == ROOT / "machine/agent" for _, folder in holders)
    assert not any(_named(left_out, *holder) for holder in holders)
    assert any(_named(kept, *holder) for holder in _rows_of(kept, table))
    assert not _resolves("no_such_module.py", holders[0][0].folders)


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


# One sitting: the page's words and its sentences' mean length, code blocks and the map's tables aside for
# the sentences (a table row is a gloss, not a sentence), everything but code blocks counted for the words.
MAX_WORDS = 3000
MAX_MEAN_SENTENCE = 25
CITED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _without_code(text: str) -> str:
    return re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)


def words(text: str) -> int:
    return sum(1 for token in _without_code(text).split() if re.search(r"[A-Za-z0-9]", token))


def sentences(text: str) -> list[str]:
    """The prose's sentences: a paragraph or a list item ends one, and so do `.`, `!` and `?` before a space."""
    blocks: list[str] = []
    current: list[str] = []
    for line in _without_code(text).splitlines():
        stripped = line.strip()
        starts_item = bool(re.match(r"^([-*]|\d+\.)\s", stripped))
        if not stripped or stripped.startswith(("|", "#")) or starts_item:
            if current:
                blocks.append(" ".join(current))
            current = [stripped] if starts_item else []
        else:
            current.append(stripped)
    if current:
        blocks.append(" ".join(current))
    return [s for block in blocks for s in re.split(r"(?<=[.!?])\s+", block) if words(s)]


def mean_sentence(text: str) -> float:
    found = sentences(text)
    return sum(words(s) for s in found) / len(found)


def test_the_page_reads_in_one_sitting() -> None:
    text = DOC.read_text()
    assert words(text) <= MAX_WORDS, (f"docs/architecture.md has {words(text)} words (at most {MAX_WORDS}): move "
                                      "detail to a topic page under docs/ and cut")
    assert mean_sentence(text) <= MAX_MEAN_SENTENCE, (
        f"docs/architecture.md's sentences average {mean_sentence(text):.1f} words (at most {MAX_MEAN_SENTENCE}): "
        "split the long ones:\n  " + "\n  ".join(sorted(sentences(text), key=words, reverse=True)[:5]))


def test_the_measures_see_a_long_page() -> None:
    long_sentence = "A step " + "and its queue " * 30 + "ends here. Short one."
    assert sentences(long_sentence) == [long_sentence[:-len(" Short one.")], "Short one."]
    assert mean_sentence(long_sentence) > MAX_MEAN_SENTENCE
    assert words("word " * (MAX_WORDS + 1)) > MAX_WORDS
    assert words("```\nmake run and more words\n```\n- one item.\n| `a.py` | a gloss |") == 5


def _defined(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def cited_tests() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for doc in sorted((ROOT / "docs").glob("*.md"))
            for m in CITED.finditer(doc.read_text())]


def test_every_test_a_doc_cites_exists() -> None:
    cited = cited_tests()
    assert len(cited) > 10, "the rules' tests were not read"
    missing = [f"{path}::{name}" for path, name in cited
               if not (ROOT / path).is_file() or name not in _defined(ROOT / path)]
    assert not missing, "docs/*.md cite tests that do not exist:\n  " + "\n  ".join(missing)


# The topic pages architecture.md links to: the same plain style, each short.
MAX_TOPIC_WORDS = 1000
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _topic_pages() -> list[Path]:
    return [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in {"architecture.md", "security.md"}]


def test_each_topic_page_is_short_and_plain() -> None:
    pages = _topic_pages()
    assert pages, "no topic page under docs/"
    linked = set(LINK.findall(DOC.read_text()))
    long = [f"{p.name}: {words(p.read_text())} words, {mean_sentence(p.read_text()):.1f} a sentence" for p in pages
            if words(p.read_text()) > MAX_TOPIC_WORDS or mean_sentence(p.read_text()) > MAX_MEAN_SENTENCE]
    assert not long, f"a topic page over {MAX_TOPIC_WORDS} words or {MAX_MEAN_SENTENCE} a sentence:\n  " + "\n  ".join(long)
    unlinked = [p.name for p in pages if p.name not in linked]
    assert not unlinked, f"docs/architecture.md links no such page: {unlinked}"


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_resolves() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md":
                headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)}
                if anchor not in headings:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links that lead nowhere:\n  " + "\n  ".join(broken)
