"""Strict verification of an adapter archive (docs/architecture.md: verify-adapter).

`verify_adapter(data, base_model=..., expected_sha256=...)` never extracts to disk and
never trusts a size the archive declares: every entry is read in bounded chunks. Each
problem is one sentence that tells the user what is wrong and what to do.

Stages: checksum -> safe unzip -> required files (each stops the later ones when it
fails: no point reading tensors from an archive that is not safe to open) -> config,
manifest, safetensors header -> LoRA pairs and shapes (when the config and header parsed)
and, only when nothing was refused so far, finite values and the manifest's digests (the
only stages that inflate the weights).

The archive is the uploader's, so no text in it is ever compiled as a regular expression
(a pattern such as "(a+)+" backtracks for minutes with the GIL held, and "(" raises):
target_modules and rank_pattern / alpha_pattern are matched as PEFT matches them, by plain
string and dict operations, and only the pattern shapes PEFT users write are accepted
(an uploader's pattern must not stall the verify step). The work is bounded: at most MAX_TENSORS tensors with names of at most
MAX_TENSOR_NAME characters, and the zip's entry count is checked before its directory is read.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import stat
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, NoReturn, TypeGuard

import numpy as np

from adapter_format.base_models import DeclaredModel, get_base_model
from adapter_format.smoke import CONFIG_NAME, MANIFEST_NAME, SMOKE_TRAINER, WEIGHTS_NAME

REQUIRED = (CONFIG_NAME, WEIGHTS_NAME, MANIFEST_NAME)


@dataclass(frozen=True)
class Layout:
    """Which entries an archive must and may hold: the adapter's three files, or a merged model's
    (adapter_format.merged). Anything else in the archive is refused, never unpacked."""

    required: tuple[str, ...]
    allowed: Callable[[str], bool]
    noun: str  # "adapter": said in the messages
    a_noun: str  # "an adapter"
    listing: str  # the files it may hold, in words


ADAPTER = Layout(REQUIRED, lambda name: name in REQUIRED, "adapter", "an adapter", ", ".join(REQUIRED))
MAX_ENTRIES = 64
# Unpacked in memory: at most the archive limit (verify_adapter.MAX_ADAPTER_BYTES), not 2 GiB (a zip may declare up to 2 GiB of
# entries, and each verify step would hold it all).
MAX_TOTAL_BYTES = 1024**3
MAX_RATIO = 100.0
RATIO_FLOOR_BYTES = 1024 * 1024  # a small JSON file may compress well; a bomb is big
# 20,000 tensors of PEFT's header entries (~150 bytes each) take 3 MiB; json.loads of the 100 MiB
# allowed before took seconds with the GIL held.
MAX_HEADER_BYTES = 8 * 1024 * 1024
MAX_JSON_BYTES = 1024 * 1024
MAX_DIMS = 4  # LoRA weights are 2-D (4-D for a convolution); 20,000 shapes of 2,000 dims took 28 s
MAX_DIM = 2**40  # one dimension; with MAX_DIMS of them the element count is exact in a Python int
# What verifying holds besides the archive's own bytes (a file is read in chunks, never whole): the
# safetensors header, the two JSON files and a few chunks of the weights in flight. Measured by
# tests/test_security_verify.py (a 128 MiB adapter).
MEMORY_BOUND_BYTES = MAX_HEADER_BYTES + 2 * MAX_JSON_BYTES + 6 * 1024 * 1024
_INT_DIGITS = 4300  # Python's default int_max_str_digits: a longer JSON integer is refused while parsing
MAX_INT = 2**63  # a JSON integer the verifier uses (a shape, an offset, a rank) is below this
# A 70B model with every linear layer adapted has 80 x 7 x 2 = 1,120 LoRA tensors; the caps keep a
# crafted header from making the pair, rank and finite-value checks run for long.
MAX_TENSORS = 20_000
MAX_TENSOR_NAME = 512  # PEFT's keys are under 150 characters
MAX_PATTERN_CHARS = 1024  # a target_modules string (see _target_matcher)
# A central directory record is 46 bytes + name + extra fields + comment; an adapter file's is
# under 200. Bounds what zipfile reads before the entry count can be checked (_declared_directory).
DIRECTORY_BYTES_PER_ENTRY = 1024
_CHUNK = 1024 * 1024
MAX_PROBLEMS = 20
_DOS_DIRECTORY = 0x10  # MS-DOS attribute bit in the low byte of external_attr

# dtype -> (item size, unsigned view, exponent mask): a value is non-finite when all its
# exponent bits are set (inf or NaN). For BF16 this is the same test as widening the
# uint16 to float32 (<< 16) and calling isfinite, without the copy.
DTYPES: dict[str, tuple[int, str, int]] = {
    "F32": (4, "<u4", 0x7F800000),
    "F16": (2, "<u2", 0x7C00),
    "BF16": (2, "<u2", 0x7F80),
}
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.(?P<adapter>[A-Za-z0-9_-]+))?\.weight$")
# DoRA (use_dora in the config): PEFT saves each adapted module's magnitude as "<module>.lora_magnitude_vector".
_MAGNITUDE_KEY = re.compile(r"^(?P<module>.+)\.lora_magnitude_vector(?:\.(?P<adapter>[A-Za-z0-9_-]+))?(?:\.weight)?$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    problems: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


class _Stop(Exception):
    """Raised inside a stage when later checks cannot run."""


def _refuse(problems: list[str], message: str) -> NoReturn:
    """Record why the archive cannot be read further, and stop: the later checks need what failed."""
    problems.append(message)
    raise _Stop


def verify_adapter(
    data: bytes | BinaryIO,
    *,
    base_model: str,
    expected_sha256: str | None,
    max_entries: int = MAX_ENTRIES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    max_ratio: float = MAX_RATIO,
    provider: str | None = None,
    smoke_allowed_on: tuple[str, ...] = (),
    model: DeclaredModel | None = None,
) -> VerifyResult:
    """data: the archive, as bytes or a seekable binary file (read in bounded chunks, never whole).
    provider: the run's compute provider; a smoke-trainer adapter is refused unless it is one of
    smoke_allowed_on (the caller passes the registry's smoke_trainer_providers(): a developer's own
    machine; on a cloud a smoke manifest means the image ran the wrong trainer). The adapter format
    knows no provider registry: the training image carries it without the control plane. None skips
    that check (callers that do not know the run). model: the base model's shapes where it is not declared
    (a Hub model's, shared/runs/hub_models.py); else the declared model named base_model."""
    source: BinaryIO = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    problems: list[str] = []
    sha256, size = _sha256_of(source)
    summary: dict[str, Any] = {"size": size, "sha256": sha256, "base_model": base_model}
    try:
        _verify(source, base_model, expected_sha256, max_entries, max_total_bytes, max_ratio,
                (provider, smoke_allowed_on), problems, summary, model=model)
    except _Stop:
        pass
    if len(problems) > MAX_PROBLEMS:  # one broken export can repeat a problem per module
        problems[MAX_PROBLEMS:] = [f"... and {len(problems) - MAX_PROBLEMS} more problems like the ones above."]
    return VerifyResult(ok=not problems, problems=problems, summary=summary)


def _sha256_of(source: BinaryIO) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    source.seek(0)
    while chunk := source.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _verify(source: BinaryIO, base_model: str, expected_sha256: str | None, max_entries: int, max_total_bytes: int,
            max_ratio: float, who: tuple[str | None, tuple[str, ...]], problems: list[str],
            summary: dict[str, Any], *, model: DeclaredModel | None = None) -> None:
    provider, smoke_allowed_on = who
    if expected_sha256 is not None and summary["sha256"] != expected_sha256.lower():
        _refuse(problems, f"The archive's sha256 is {summary['sha256']}, not the {expected_sha256} the agent "
                          "reported; the upload is incomplete or was replaced, so upload the adapter again.")
    archive = _safe_unzip(source, summary["size"], max_entries, max_total_bytes, max_ratio, problems, summary)
    # The two JSON files whole (at most MAX_JSON_BYTES each); the weights are streamed, never held.
    config_raw, manifest_raw = archive.read_small(CONFIG_NAME), archive.read_small(MANIFEST_NAME)
    config = _check_config(config_raw, base_model, problems, summary)
    manifest = _check_manifest(manifest_raw, base_model, provider, smoke_allowed_on, problems, summary)
    with archive.stream(WEIGHTS_NAME) as weights:
        tensors = _parse_safetensors(weights, archive.size(WEIGHTS_NAME), problems, summary)
        if config is not None:  # a manifest problem need not hide a shape problem: report both
            _check_pairs(config, tensors, base_model, problems, summary, model=model)
        if problems:
            # Refused already: the checks so far read the JSON files and the header only; inflating,
            # hashing and scanning the weights (up to 1 GiB, seconds of CPU) would change no answer.
            raise _Stop
        _check_finite(weights, tensors, problems)
        digests = {CONFIG_NAME: hashlib.sha256(config_raw).hexdigest(), WEIGHTS_NAME: weights.sha256(),
                   MANIFEST_NAME: hashlib.sha256(manifest_raw).hexdigest()}
    summary["unpacked_bytes"] = archive.total
    if manifest is not None:
        _check_listed(manifest, digests, problems)


# ---------------------------------------------------------------- safe unzip


def _unsafe_name(name: str) -> str:
    """Why a member name is unsafe, or "" when it is a plain relative path."""
    if "\\" in name or "\0" in name:
        return "contains a backslash or NUL character"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "is an absolute path"
    parts = name.rstrip("/").split("/")
    if ".." in parts:
        return "climbs out of the archive with '..'"
    if any(p in ("", ".") for p in parts):
        return "has an empty or '.' path component"
    return ""


# The records that end a zip: (signature, layout). zipfile reads the central directory whose size
# they declare, whatever the entry count says, so both the count and the size are checked.
_EOCD = (b"PK\x05\x06", struct.Struct("<4s4H2LH"))  # entries on this disk, in all, directory size, offset
_ZIP64_LOCATOR = (b"PK\x06\x07", struct.Struct("<4sLQL"))
_ZIP64_EOCD = (b"PK\x06\x06", struct.Struct("<4sQ2H2L4Q"))


def _declared_directory(data: bytes) -> tuple[int, int] | None:
    """(entries, central directory bytes) as the end-of-central-directory record, or the ZIP64
    record before it, declares them; found where zipfile.ZipFile looks (the last 22 bytes, else the
    last match within 64 KiB of comment), so this is the directory it would read. None without such
    a record: zipfile then says what is wrong."""
    signature, eocd = _EOCD
    if data[-eocd.size:].startswith(signature) and data[-2:] == b"\0\0":
        at = len(data) - eocd.size
    else:
        at = data.rfind(signature, max(len(data) - eocd.size - 0xFFFF, 0))
    if at < 0 or at + eocd.size > len(data):
        return None
    _, _, _, on_disk, total, size, _, _ = eocd.unpack_from(data, at)
    entries = max(on_disk, total)
    locator_sig, locator = _ZIP64_LOCATOR
    zip64_sig, zip64 = _ZIP64_EOCD
    record = at - locator.size - zip64.size
    if record >= 0 and data.startswith(locator_sig, at - locator.size) and data.startswith(zip64_sig, record):
        _, _, _, _, _, _, on_disk, total, size, _ = zip64.unpack_from(data, record)
        entries = max(on_disk, total)
    return entries, size


# The end of an archive that _declared_directory reads: the end record, a comment of up to 64 KiB,
# and a ZIP64 locator and record before them.
_TAIL_BYTES = _EOCD[1].size + 0xFFFF + _ZIP64_LOCATOR[1].size + _ZIP64_EOCD[1].size


_READ_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, zlib.error)


class _Member:
    """One entry being read: every read is bounded by what the entry declares, the archive's total
    budget and the compression ratio, whatever its header claims; the bytes read are hashed."""

    def __init__(self, archive: _Archive, info: zipfile.ZipInfo) -> None:
        self.archive, self.info = archive, info
        self.size = 0
        self._digest = hashlib.sha256()
        try:
            self._stream = archive.zf.open(info)
        except _READ_ERRORS as exc:
            self._damaged(exc)

    def _damaged(self, exc: BaseException) -> NoReturn:
        self.archive.problems.append(f"Archive entry {self.info.filename!r} is damaged ({exc}); upload the "
                                     "archive again.")
        raise _Stop from exc

    def read(self, n: int) -> bytes:
        try:
            chunk = self._stream.read(n)
        except _READ_ERRORS as exc:
            self._damaged(exc)
        self.size += len(chunk)
        self.archive.total += len(chunk)
        name, limit = self.info.filename, self.archive.max_ratio
        if self.size > self.info.file_size or self.archive.total > self.archive.max_total_bytes:
            _refuse(self.archive.problems, f"Archive entry {name!r} unpacks to more than it declares or than the "
                                           "size allowed; rebuild the archive.")
        if self.size >= RATIO_FLOOR_BYTES and self.size > limit * max(self.info.compress_size, 1):
            _refuse(self.archive.problems, f"Archive entry {name!r} expands more than {limit:.0f}:1, which looks "
                                           "like a zip bomb; it was not unpacked.")
        self._digest.update(chunk)
        return chunk

    def read_exactly(self, n: int) -> bytes | None:
        """n bytes, or None where the entry ends first."""
        parts, want = [], n
        while want > 0:
            chunk = self.read(min(want, _CHUNK))
            if not chunk:
                return None
            parts.append(chunk)
            want -= len(chunk)
        return b"".join(parts)

    def sha256(self) -> str:
        """Of the whole entry: the rest is read (and checked: its CRC too) first."""
        while self.read(_CHUNK):
            pass
        return self._digest.hexdigest()

    def __enter__(self) -> _Member:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stream.close()


@dataclass
class _Archive:
    """The zip whose directory passed: its three entries, read through _Member."""

    zf: zipfile.ZipFile
    infos: dict[str, zipfile.ZipInfo]
    max_total_bytes: int
    max_ratio: float
    problems: list[str]
    total: int = 0  # bytes unpacked so far, over every entry

    def size(self, name: str) -> int:
        return self.infos[name].file_size

    def stream(self, name: str) -> _Member:
        return _Member(self, self.infos[name])

    def read_small(self, name: str) -> bytes:
        """A JSON entry whole, refused (not read) above MAX_JSON_BYTES."""
        if self.infos[name].file_size > MAX_JSON_BYTES:
            _refuse(self.problems, f"{name} is {self.infos[name].file_size} bytes, more than the {MAX_JSON_BYTES} "
                                   "allowed for a JSON file.")
        with self.stream(name) as member:
            data = member.read_exactly(self.infos[name].file_size) or b""
            member.sha256()  # to its end: more than it declares, or a bad CRC, is refused
        return data


def _safe_unzip(source: BinaryIO, size: int, max_entries: int, max_total_bytes: int, max_ratio: float,
                problems: list[str], summary: dict[str, Any], *, layout: Layout = ADAPTER) -> _Archive:
    """The archive opened for reading, after its directory passed every bound: the entry count and
    directory size it declares, then each entry's name, type and storage, the layout's files, the
    total unpacked size. Nothing is unpacked here."""
    _check_declared_directory(source, size, max_entries, problems, summary)
    zf = _open_zip(source, problems)
    infos = zf.infolist()
    summary["entries"] = len(infos)
    _check_entry_count(len(infos), max_entries, problems, summary)
    seen = _check_entries(infos, layout, max_ratio, problems)
    _check_required(seen, layout, problems)
    if problems:
        raise _Stop
    _check_total_size(infos, max_total_bytes, problems)
    summary["files"] = sorted(seen)
    return _Archive(zf, {i.filename: i for i in infos}, max_total_bytes, max_ratio, problems)


def _check_declared_directory(source: BinaryIO, size: int, max_entries: int, problems: list[str],
                              summary: dict[str, Any]) -> None:
    """The entry count and central directory size the end record declares, before zipfile parses the
    directory (400,000 entries took it 13 s and 150 MiB)."""
    source.seek(max(size - _TAIL_BYTES, 0))
    declared = _declared_directory(source.read(_TAIL_BYTES))
    if declared is None:
        return
    entries, directory_bytes = declared
    _check_entry_count(entries, max_entries, problems, summary)
    if directory_bytes > max_entries * DIRECTORY_BYTES_PER_ENTRY:  # an entry count that lies
        _refuse(problems, f"The archive's central directory is {directory_bytes} bytes, more than "
                          f"{max_entries} entries need; zip only the adapter files.")


def _check_entry_count(entries: int, max_entries: int, problems: list[str], summary: dict[str, Any]) -> None:
    """At most max_entries: zipfile parses and holds a record of each."""
    if entries > max_entries:
        summary["entries"] = entries
        _refuse(problems, f"The archive has {entries} entries, more than the {max_entries} allowed; "
                          "zip only the adapter files.")


def _open_zip(source: BinaryIO, problems: list[str]) -> zipfile.ZipFile:
    """zipfile's reading of the directory; what it cannot read is refused (a directory record that needs
    a newer zip version than zipfile's raised NotImplementedError out of the verify step)."""
    try:
        source.seek(0)
        return zipfile.ZipFile(source)
    except (*_READ_ERRORS, zipfile.LargeZipFile) as exc:
        _refuse(problems, f"The file is not a readable zip archive ({exc}); upload the adapter as a .zip file.")


def _check_entries(infos: list[zipfile.ZipInfo], layout: Layout, max_ratio: float, problems: list[str]) -> set[str]:
    """Every entry's problems, in the entry's order (all of them: the user fixes the archive once);
    returns the names seen."""
    seen: set[str] = set()
    for info in infos:
        name = info.filename
        twice = f"Archive entry {name!r} appears twice; keep one copy of each file." if name in seen else ""
        found = (_name_problem(name, layout), _kind_problem(info), twice, *_storage_problems(info, max_ratio))
        problems.extend(p for p in found if p)
        seen.add(name)
    return seen


def _name_problem(name: str, layout: Layout) -> str:
    """A plain relative path, at the top level, of a file the layout holds; "" when it is."""
    why = _unsafe_name(name)
    if why:
        return f"Archive entry {name!r} {why}; rebuild the archive with plain relative paths."
    if layout.allowed(name.rsplit("/", 1)[-1]) and not layout.allowed(name):
        return f"{name} is inside a folder; put the {layout.noun} files at the top level of the archive."
    if not layout.allowed(name) and not name.endswith("/"):  # an empty folder entry is never read
        # Nothing but the adapter is unpacked: 1000 MiB of junk beside a good adapter took the host
        # from 0.56 to 2.13 GiB.
        return (f"Archive entry {name!r} is not part of {layout.a_noun}; the archive must hold only "
                f"{layout.listing}, so zip only those.")
    return ""


def _kind_problem(info: zipfile.ZipInfo) -> str:
    """A regular file, or an empty folder named as one; "" when it is.

    Unix mode in the high 16 bits. zipfile.writestr(name, data) writes 0o600 with no file-type
    bits at all, and Windows tools write 0: both are plain files. A link, device, FIFO or socket
    type is refused, and so is a directory (Unix type or DOS attribute) whose name does not end
    in "/", which zipfile would otherwise read as a file."""
    name, mode = info.filename, info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    is_dir_attr = stat.S_ISDIR(mode) or bool(info.external_attr & _DOS_DIRECTORY)
    if stat.S_ISLNK(mode):
        return f"Archive entry {name!r} is a symbolic link; zip the files themselves, not links."
    if kind and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return f"Archive entry {name!r} is not a regular file; zip only regular files."
    if is_dir_attr and not name.endswith("/"):
        return f"Archive entry {name!r} is marked as a directory but named like a file; zip only regular files."
    if name.endswith("/") and info.file_size:
        return f"Archive entry {name!r} is a directory that holds data; rebuild the archive."
    return ""


def _storage_problems(info: zipfile.ZipInfo, max_ratio: float) -> list[str]:
    """Stored or deflated, unencrypted, and expanding at most max_ratio:1 as declared (what it
    really unpacks to is bounded again while it is read: _Member)."""
    name, found = info.filename, []
    if info.flag_bits & 0x1:
        found.append(f"Archive entry {name!r} is encrypted; upload an unencrypted archive.")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        found.append(f"Archive entry {name!r} uses compression method {info.compress_type}; "
                     "use plain deflate or no compression.")
    if info.file_size >= RATIO_FLOOR_BYTES and info.file_size > max_ratio * max(info.compress_size, 1):
        found.append(f"Archive entry {name!r} expands {info.file_size} bytes from {info.compress_size} "
                     f"(more than {max_ratio:.0f}:1), which looks like a zip bomb; it was not unpacked.")
    return found


def _check_required(seen: set[str], layout: Layout, problems: list[str]) -> None:
    for name in layout.required:
        if name not in seen:
            problems.append(f"The archive has no {name} at its top level; the {layout.noun} archive needs "
                            f"{', '.join(layout.required)}.")


def _check_total_size(infos: list[zipfile.ZipInfo], max_total_bytes: int, problems: list[str]) -> None:
    """What the entries declare, together (each is held to its declared size while it is read)."""
    declared_total = sum(i.file_size for i in infos)
    if declared_total > max_total_bytes:
        _refuse(problems, f"The archive unpacks to {declared_total} bytes, more than the {max_total_bytes} allowed.")


# ---------------------------------------------------------------- config and manifest


class _JsonLimit(ValueError):
    pass


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _INT_DIGITS:
        raise _JsonLimit(f"an integer of {len(text.lstrip('-'))} digits, more than {_INT_DIGITS}")
    return int(text)


def parse_json(raw: bytes) -> Any:
    """json.loads with every cost bounded (raw is at most a few MiB), any failure a ValueError with
    the reason (deep nesting raised RecursionError out of the verifier before, and a huge integer
    OverflowError where it was used): nesting as deep as the interpreter's recursion allows, integers
    of at most the interpreter's int_max_str_digits (4,300 by default; where that limit is off, a
    hook parses them, slower, at most _INT_DIGITS). Values are bounded where used (_is_int)."""
    limit = sys.get_int_max_str_digits()
    try:
        if 0 < limit <= _INT_DIGITS:
            return json.loads(raw)
        return json.loads(raw, parse_int=_bounded_int)
    except RecursionError as exc:
        raise _JsonLimit("it nests too deeply") from exc
    except UnicodeDecodeError as exc:
        raise _JsonLimit(f"it is not UTF-8 ({exc.reason} at byte {exc.start})") from exc


def _load_json(raw: bytes, name: str, problems: list[str]) -> dict[str, Any] | None:
    if len(raw) > MAX_JSON_BYTES:
        problems.append(f"{name} is {len(raw)} bytes, more than the {MAX_JSON_BYTES} allowed for a JSON file.")
        return None
    try:
        value = parse_json(raw)
    except ValueError as exc:
        problems.append(f"{name} is not valid JSON ({exc}); write it with json.dump.")
        return None
    if not isinstance(value, dict):
        problems.append(f"{name} must hold a JSON object, not {type(value).__name__}.")
        return None
    return value


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and -MAX_INT < v < MAX_INT


def _is_number(v: Any) -> TypeGuard[int | float]:
    # Bounded ints only: math.isfinite of a huge one raised OverflowError.
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


def _brief(value: Any, width: int = 80) -> str:
    """repr(value), cut short: a config may hold a 1 MiB list, and a message may repeat per module."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


# ---------------------------------------------------------------- PEFT's module matching, without regexes

_END = None  # a trie node's key for "a name ends here"; parts are strings, so it never collides


class _DottedNames:
    """Names matched as PEFT matches a module key against a target_modules list (and, in recent
    PEFT, a rank_pattern key): the key equals the name or ends with "." + name. The names sit in a
    trie of their dot-separated parts, last part first, so a key costs one dict lookup per part
    however many names the config lists."""

    def __init__(self, names: Iterable[str]) -> None:
        self._root: dict[str | None, Any] = {}
        for place, name in enumerate(names):
            node = self._root
            for part in reversed(name.split(".")):
                node = node.setdefault(part, {})
            node.setdefault(_END, place)  # of two equal names the first counts, as in PEFT

    def first(self, key: str, *, proper: bool = False) -> int | None:
        """The place of the first-listed name that matches key, or None. proper: only a name with
        a dot before it in key (what a `.*\\.name` pattern matches)."""
        found: int | None = None
        node = self._root
        parts = key.split(".")
        for depth, part in enumerate(reversed(parts), start=1):
            child = node.get(part)
            if child is None:
                break
            node = child
            place = node.get(_END)
            if place is not None and not (proper and depth == len(parts)) and (found is None or place < found):
                found = place
        return found


# Our own fixed patterns, run on config text of bounded length; each repetition starts with a
# character the one before cannot match, so they do not backtrack.
_PATTERN_NAME = re.compile(r"[A-Za-z0-9_]+(?:\\\.[A-Za-z0-9_]+)*")  # q_proj, self_attn\.q_proj
_DOTTED_NAME = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")  # q_proj, layers.0.self_attn.q_proj


def _target_matcher(targets: Any) -> Callable[[str], bool] | None:
    """target_modules as PEFT applies it to a module key, or None when the verifier will not judge it.

    A list: the key equals a name or ends with "." + name. "all-linear": every module. Any other
    string is a regular expression that PEFT fullmatches; of those only the shapes PEFT users write
    are accepted, parsed by hand: an optional `.*` or `.*\\.`, then one name or a group `(a|b)` /
    `(?:a|b)` of names (parts joined by `\\.`), then an optional `$`."""
    if isinstance(targets, list):
        listed = _DottedNames(targets)
        return lambda key: listed.first(key) is not None
    if not isinstance(targets, str) or len(targets) > MAX_PATTERN_CHARS:
        return None
    if targets.lower() == "all-linear":  # PEFT's shorthand, when a config keeps it unexpanded
        return lambda key: True
    return _pattern_matcher(targets)


def _pattern_matcher(pattern: str) -> Callable[[str], bool] | None:
    """A target_modules regular expression of the shapes PEFT users write, parsed by hand (see
    _target_matcher); None for any other."""
    body = pattern.removesuffix("$")  # fullmatch anchors the end anyway
    prefix = next((p for p in (".*\\.", ".*") if body.startswith(p)), "")
    body = body[len(prefix):]
    group = next((g for g in ("(?:", "(") if body.startswith(g) and body.endswith(")")), None)
    # Outside a group "|" would split the whole pattern ("a|.*\\.b"), so it is not a name character.
    parts = body[len(group):-1].split("|") if group else [body]
    if not all(_PATTERN_NAME.fullmatch(part) for part in parts):
        return None
    names = [part.replace("\\.", ".") for part in parts]
    if prefix == ".*\\.":
        dotted = _DottedNames(names)
        return lambda key: dotted.first(key, proper=True) is not None
    if prefix == ".*":
        ends = tuple(names)
        return lambda key: key.endswith(ends)
    whole = frozenset(names)
    return lambda key: key in whole


def _pattern_keys(config: dict[str, Any], field_name: str, problems: list[str]) -> list[str]:
    """rank_pattern / alpha_pattern keys as dotted module names. PEFT matches each key as a regex
    against the module key's end; here a key is a literal dotted suffix (an escaped `\\.` is a dot),
    and a key with any other regex syntax is refused rather than compiled."""
    pattern = config.get(field_name) or {}
    ranks = field_name == "rank_pattern"
    if not isinstance(pattern, dict) or not all((_is_int(v) if ranks else _is_number(v)) and v > 0
                                                for v in pattern.values()):
        what = "ranks" if ranks else "alphas"
        problems.append(f"{CONFIG_NAME} has an invalid {field_name}; it must map module names to {what} above 0.")
        return []
    keys = [key.replace("\\.", ".") for key in pattern]
    bad = next((k for k, plain in zip(pattern, keys, strict=True) if not _DOTTED_NAME.fullmatch(plain)), None)
    if bad is not None:
        problems.append(f"{CONFIG_NAME} has {field_name} key {_brief(bad)}, which is not a module name; the verifier "
                        "does not evaluate regular expressions, so name each module by its dotted path "
                        "(for example \"q_proj\" or \"layers.0.self_attn.q_proj\").")
        return []
    return keys


@dataclass(frozen=True)
class _Lora:
    """What the pair checks need from a sane adapter_config.json."""

    r: int
    targets: Any  # as written: for messages and the missing-layers check
    targeted: Callable[[str], bool]  # of a PEFT module key (_peft_key)
    ranks: _DottedNames  # rank_pattern's keys, in order
    rank_values: list[int]
    use_dora: bool = False  # DoRA: one magnitude vector [out] per adapted module beside its pair


def _check_config(raw: bytes, base_model: str, problems: list[str], summary: dict[str, Any]) -> _Lora | None:
    """adapter_config.json: a LoRA config of the run's base model, with a rank, an alpha and target
    modules the verifier can judge; None when any of it is wrong (the pair checks need all of it)."""
    config = _load_json(raw, CONFIG_NAME, problems)
    if config is None:
        return None
    before = len(problems)
    problems.extend(_lora_problems(config))
    targets = config.get("target_modules")
    targeted = _targets(targets, problems)
    found = config.get("base_model_name_or_path")
    if found != base_model:
        problems.append(f"{CONFIG_NAME} names base model {found!r}, but this run trains {base_model!r}; "
                        "train the adapter on the run's base model.")
    rank_keys = _pattern_keys(config, "rank_pattern", problems)
    _pattern_keys(config, "alpha_pattern", problems)  # alphas do not change shapes: checked, not used
    summary.update(r=config.get("r"), lora_alpha=config.get("lora_alpha"), target_modules=targets)
    if len(problems) != before or targeted is None:
        return None
    return _Lora(r=config["r"], targets=targets, targeted=targeted, ranks=_DottedNames(rank_keys),
                 rank_values=[int(v) for v in (config.get("rank_pattern") or {}).values()],
                 use_dora=config.get("use_dora") is True)


def _lora_problems(config: dict[str, Any]) -> list[str]:
    """peft_type LORA, a whole rank above 0 and a lora_alpha above 0."""
    found = []
    if config.get("peft_type") != "LORA":
        found.append(f"{CONFIG_NAME} has peft_type {config.get('peft_type')!r}; only LoRA adapters "
                     "(peft_type \"LORA\") are accepted.")
    r = config.get("r")
    if not (_is_int(r) and r > 0):
        found.append(f"{CONFIG_NAME} has r = {_brief(r)}; the LoRA rank must be a whole number above 0.")
    alpha = config.get("lora_alpha")
    if not (_is_number(alpha) and alpha > 0):
        found.append(f"{CONFIG_NAME} has lora_alpha = {_brief(alpha)}; it must be a number above 0.")
    return found


def _targets(targets: Any, problems: list[str]) -> Callable[[str], bool] | None:
    """target_modules as a matcher: a non-empty string, or a non-empty list of non-empty names, that
    _target_matcher can judge; None (a problem recorded) otherwise."""
    if not ((isinstance(targets, str) and targets) or (isinstance(targets, list) and targets and all(
            isinstance(t, str) and t for t in targets))):
        problems.append(f"{CONFIG_NAME} has target_modules = {_brief(targets)}; name the modules LoRA adapts "
                        "(for example [\"q_proj\", \"v_proj\"]).")
        return None
    targeted = _target_matcher(targets)
    if targeted is None:
        problems.append(f"{CONFIG_NAME} has target_modules = {_brief(targets)}, a regular expression the verifier "
                        "does not evaluate (it accepts \"all-linear\" and plain alternations such as "
                        "\".*\\\\.(q_proj|v_proj)\"); write target_modules as a list of module names, for example "
                        "[\"q_proj\", \"v_proj\"].")
    return targeted


def _check_manifest(raw: bytes, base_model: str, provider: str | None, smoke_allowed_on: tuple[str, ...],
                    problems: list[str],
                    summary: dict[str, Any]) -> dict[str, Any] | None:
    """manifest.json: a real trainer's (the smoke trainer only where allowed) of the run's base model;
    what it measured goes to the summary."""
    manifest = _load_json(raw, MANIFEST_NAME, problems)
    if manifest is None:
        return None
    if manifest.get("trainer") == SMOKE_TRAINER and provider is not None and provider not in smoke_allowed_on:
        where = f"on the {' or '.join(smoke_allowed_on)} provider" if smoke_allowed_on else "on a developer's machine"
        problems.append(f"{MANIFEST_NAME} says the adapter was written by the smoke trainer, which trains nothing; "
                        f"it is accepted only {where}, not {provider!r}. Run the "
                        "real trainer (the training image's default TENSORANT_TRAINER_COMMAND).")
    if "base_model" in manifest and manifest["base_model"] != base_model:
        problems.append(f"{MANIFEST_NAME} names base model {manifest['base_model']!r}, but this run trains "
                        f"{base_model!r}.")
    summary.update(_measured(manifest))
    return manifest


def _measured(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the trainer reports, for the summary: only numbers pass."""
    found = {"trainer": manifest.get("trainer"), "rows": manifest.get("rows") if _is_int(manifest.get("rows")) else None}
    # What the trainer measured, for the forecast's check (shared/runs/forecast.compare).
    for key in ("train_seconds", "tokens", "steps"):
        if _is_number(manifest.get(key)):
            found[key] = manifest[key]
    if _is_int(manifest.get("checkpoint_step")):  # a checkpoint's adapter, not the final one
        found.update(checkpoint_step=manifest["checkpoint_step"],
                     steps=manifest.get("steps") if _is_int(manifest.get("steps")) else None)
    return found


def _check_listed(manifest: dict[str, Any], digests: dict[str, str], problems: list[str]) -> None:
    """The files the manifest lists are in the archive, with its sha256 (digests: of every entry)."""
    listed = manifest.get("files", {})
    if not isinstance(listed, dict):
        problems.append(f"{MANIFEST_NAME} has a 'files' entry that is not an object of name -> {{sha256}}.")
        listed = {}
    for name, entry in listed.items():
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if name not in digests:
            problems.append(f"{MANIFEST_NAME} lists {_brief(name)}, which is not in the archive; the export is "
                            "incomplete.")
        elif digest is not None and digests[name] != digest:
            problems.append(f"{name} does not match the sha256 in {MANIFEST_NAME}; the file changed after "
                            "training wrote it, so export the adapter again.")


# ---------------------------------------------------------------- safetensors


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offsets in the file
    end: int


def _parse_safetensors(weights: _Member, size: int, problems: list[str], summary: dict[str, Any],
                       name: str = WEIGHTS_NAME) -> list[_Tensor]:
    """The header of the weights entry (size bytes, as the zip declares; reading more is refused),
    read from its stream: the tensor data after it is left to _check_finite. A header that fails
    stops the verification (_Stop): no tensor of it can be trusted."""
    header_len = _header_length(weights, size, name, problems)
    header = _header_object(weights, header_len, size, name, problems)
    _check_tensor_count(header, name, problems)
    base = 8 + header_len
    tensors = _header_tensors(header, base, size - base, name, problems)
    _check_coverage(tensors, base, size, name, problems)
    summary["tensors"] = len(tensors)
    summary["dtypes"] = sorted({t.dtype for t in tensors})
    return tensors


def _header_length(weights: _Member, size: int, name: str, problems: list[str]) -> int:
    """The header's length, the file's first 8 bytes, at most MAX_HEADER_BYTES."""
    head = weights.read_exactly(8)
    if head is None:
        _refuse(problems, f"{name} is {size} bytes, too short to hold a safetensors header; export it again.")
    (header_len,) = struct.unpack("<Q", head)
    if header_len > MAX_HEADER_BYTES:
        _refuse(problems, f"{name} declares a {header_len}-byte header, more than the {MAX_HEADER_BYTES} allowed; "
                          "the file is corrupt or not a safetensors file.")
    return int(header_len)


def _header_object(weights: _Member, header_len: int, size: int, name: str, problems: list[str]) -> dict[str, Any]:
    """The header's JSON object (parse_json bounds its nesting and integers), read only when the
    file holds all of it."""
    raw = weights.read_exactly(header_len) if 8 + header_len <= size else None
    if raw is None:
        _refuse(problems, f"{name} declares a {header_len}-byte header but the file is only {size} bytes; "
                          "the file is truncated, so export it again.")
    try:
        header = parse_json(raw)
    except ValueError as exc:
        _refuse(problems, f"{name} has a header that is not valid JSON ({exc}); the file is corrupt.")
    if not isinstance(header, dict):
        _refuse(problems, f"{name} has a header that is not a JSON object; the file is corrupt.")
    return header


def _check_tensor_count(header: dict[str, Any], name: str, problems: list[str]) -> None:
    """At most MAX_TENSORS tensors: the pair, rank and finite-value checks run over each."""
    count = len(header) - ("__metadata__" in header)
    if count > MAX_TENSORS:
        _refuse(problems, f"{name} holds {count} tensors, more than the {MAX_TENSORS} allowed; "
                          "save only the LoRA adapter weights.")


def _header_tensors(header: dict[str, Any], base: int, buffer_len: int, name: str,
                    problems: list[str]) -> list[_Tensor]:
    """Every entry's tensor (base: where the data section starts, buffer_len bytes long); each
    malformed entry is reported, and any stops."""
    tensors: list[_Tensor] = []
    before = len(problems)
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        fields = _entry_fields(key, entry, name)
        found = fields if isinstance(fields, str) else _entry_data(key, *fields, base, buffer_len, name)
        if isinstance(found, str):
            problems.append(found)
        else:
            tensors.append(found)
    if len(problems) != before:
        raise _Stop
    return tensors


def _entry_fields(key: str, entry: Any, name: str) -> tuple[str, list[int], list[int]] | str:
    """A header entry's dtype, shape and data_offsets, each of its form; or what is wrong with it."""
    if len(key) > MAX_TENSOR_NAME:
        return (f"{name}: tensor {_brief(key)} has a {len(key)}-character name, more than the "
                f"{MAX_TENSOR_NAME} allowed; the file is corrupt or not a PEFT adapter.")
    if not isinstance(entry, dict):
        return f"{name}: tensor {key} has a malformed header entry."
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPES:
        return f"{name}: tensor {key} has dtype {dtype!r}; save the adapter as F32, F16 or BF16."
    if isinstance(shape, list) and len(shape) > MAX_DIMS:  # before a loop over its dimensions
        return (f"{name}: tensor {key} has {len(shape)} dimensions, more than the {MAX_DIMS} a LoRA "
                "weight has; the file is corrupt or not a PEFT adapter.")
    if not _is_shape(shape) or not _is_offsets(offsets):
        return f"{name}: tensor {key} has a malformed shape or data_offsets."
    return dtype, shape, offsets


def _is_shape(shape: Any) -> TypeGuard[list[int]]:
    return isinstance(shape, list) and all(_is_int(d) and 0 <= d <= MAX_DIM for d in shape)


def _is_offsets(offsets: Any) -> TypeGuard[list[int]]:
    return isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)


def _entry_data(key: str, dtype: str, shape: list[int], offsets: list[int], base: int, buffer_len: int,
                name: str) -> _Tensor | str:
    """The entry's data inside the data section and exactly as long as its shape and dtype need."""
    start, end = offsets
    if not 0 <= start <= end <= buffer_len:
        return (f"{name}: tensor {key} points at bytes {start}..{end} outside the {buffer_len}-byte "
                "data section; the file is truncated or corrupt.")
    expected = math.prod(shape) * DTYPES[dtype][0]  # exact: at most MAX_DIMS factors of MAX_DIM
    if end - start != expected:
        return (f"{name}: tensor {key} has {end - start} bytes of data but shape {shape} in {dtype} "
                f"needs {expected}; the file is corrupt.")
    return _Tensor(key, dtype, tuple(shape), base + start, base + end)


def _check_coverage(tensors: list[_Tensor], base: int, size: int, name: str, problems: list[str]) -> None:
    """The data section covered exactly, in order: no gaps, no overlaps, nothing after."""
    position = base
    for t in sorted(tensors, key=lambda t: (t.start, t.end)):
        if t.start != position:
            _refuse(problems, f"{name}: tensor {t.name} starts at byte {t.start - base}, not {position - base}; "
                              "tensor data overlaps or leaves gaps, so the file is corrupt.")
        position = t.end
    if position != size:
        _refuse(problems, f"{name} has {size - position} bytes after the last tensor; the file is corrupt.")


# ---------------------------------------------------------------- LoRA pairs


def _peft_key(module: str) -> str:
    """The module's name in the base model, which PEFT matches its config against: the saved key
    without the "base_model.model." that PeftModel puts before it."""
    return module.removeprefix("base_model.model.")


def _rank_for(module: str, lora: _Lora) -> int:
    place = lora.ranks.first(_peft_key(module))  # the first matching key, as PEFT's lookup
    return lora.r if place is None else lora.rank_values[place]


def _check_pairs(lora: _Lora, tensors: list[_Tensor], base_model: str, problems: list[str],
                 summary: dict[str, Any], *, model: DeclaredModel | None = None) -> None:
    """The LoRA weights against the config and the declared base model: only lora_A/lora_B pairs (and
    DoRA magnitudes), each targeted, of the configured rank, fitting the base model's module, and
    every layer of every target adapted. problems may hold the config's and the manifest's already:
    the checks that judge the whole export run only when nothing else is wrong."""
    declared = model or get_base_model(base_model)  # model: a Hub model's shapes, read from its config.json
    summary["base_model_declared"] = declared is not None
    pairs, magnitudes = _group_tensors(tensors, lora.use_dora, problems)
    if not pairs and not problems:
        problems.append(f"{WEIGHTS_NAME} holds no LoRA weights; the export wrote an empty adapter.")
    for module, pair in sorted(pairs.items()):
        _check_pair(module, pair, lora, declared, base_model, problems)
    _check_magnitudes(magnitudes, pairs, lora.use_dora, problems)
    summary["modules"] = len(pairs)
    if declared is not None and isinstance(lora.targets, list) and not problems:
        _check_every_layer(pairs, lora.targets, declared, base_model, problems)


def _group_tensors(tensors: list[_Tensor], use_dora: bool,
                   problems: list[str]) -> tuple[dict[str, dict[str, _Tensor]], dict[str, _Tensor]]:
    """module -> {"A": lora_A, "B": lora_B}, and module -> DoRA magnitude; any other tensor is refused."""
    pairs: dict[str, dict[str, _Tensor]] = {}
    magnitudes: dict[str, _Tensor] = {}
    for t in tensors:
        match = _LORA_KEY.match(t.name)
        if match is None and use_dora and (dora := _MAGNITUDE_KEY.match(t.name)) is not None:
            magnitudes[dora["module"]] = t
        elif match is None:
            problems.append(f"{WEIGHTS_NAME} holds {t.name}, which is not a lora_A/lora_B weight; "
                            "save only the LoRA adapter weights.")
        else:
            pairs.setdefault(match["module"], {})[match["ab"]] = t
    return pairs, magnitudes


def _check_pair(module: str, pair: dict[str, _Tensor], lora: _Lora, declared: DeclaredModel | None, base_model: str,
                problems: list[str]) -> None:
    """One adapted module: both halves, in target_modules, of its rank, fitting the base model."""
    if set(pair) != {"A", "B"}:
        have = next(iter(pair))
        want = "B" if have == "A" else "A"
        problems.append(f"{WEIGHTS_NAME} has lora_{have} but no lora_{want} for {module}; every adapted "
                        "module needs both.")
        return
    a, b = pair["A"], pair["B"]
    if not lora.targeted(_peft_key(module)):
        problems.append(f"{WEIGHTS_NAME} adapts {module}, which is not in target_modules {_brief(lora.targets)}.")
    rank = _rank_problem(module, a, b, lora)
    if rank:
        problems.append(rank)
    elif declared is not None:
        problems.extend(_fit_problems(module, a, b, declared, base_model))


def _rank_problem(module: str, a: _Tensor, b: _Tensor, lora: _Lora) -> str:
    """A [r, in] and B [out, r], r the module's rank in the config; "" when they are."""
    if len(a.shape) != 2 or len(b.shape) != 2:
        return f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} must both be 2-D."
    rank = _rank_for(module, lora)
    if a.shape[0] != rank or b.shape[1] != rank:
        return (f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not have the "
                f"rank r = {rank} from {CONFIG_NAME} (expected A [r, in] and B [out, r]).")
    return ""


def _fit_problems(module: str, a: _Tensor, b: _Tensor, declared: DeclaredModel, base_model: str) -> list[str]:
    """The module in the base model: a layer it has, a module it has, and that module's in and out."""
    found = []
    short = module.rsplit(".", 1)[-1]
    layer = _LAYER.search("." + module + ".")
    if layer and int(layer.group(1)) >= declared.num_layers:
        found.append(f"{module}: {base_model} has only {declared.num_layers} layers.")
    dims = declared.modules.get(short)
    if dims is None:
        found.append(f"{module}: {base_model} has no module {short!r} that a LoRA adapter can target "
                     f"(known: {', '.join(sorted(declared.modules))}).")
    elif (a.shape[1], b.shape[0]) != dims:
        found.append(f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit "
                     f"{base_model}, whose {short} maps {dims[0]} -> {dims[1]}; was it trained on "
                     "another model?")
    return found


def _check_magnitudes(magnitudes: dict[str, _Tensor], pairs: dict[str, dict[str, _Tensor]], use_dora: bool,
                      problems: list[str]) -> None:
    """DoRA: one magnitude [out] beside each pair, and (when nothing else is wrong) one for every pair."""
    for module, magnitude in sorted(magnitudes.items()):
        pair = pairs.get(module, {})
        if "B" not in pair:
            problems.append(f"{WEIGHTS_NAME} holds a DoRA magnitude for {module}, which has no LoRA pair.")
        elif magnitude.shape != (pair["B"].shape[0],):
            problems.append(f"{module}: the DoRA magnitude {list(magnitude.shape)} must have one value per output "
                            f"feature ([{pair['B'].shape[0]}], as lora_B {list(pair['B'].shape)}).")
    if use_dora and pairs and len(magnitudes) != len(pairs) and not problems:
        problems.append(f"{CONFIG_NAME} says use_dora, but {len(pairs) - len(magnitudes)} of the {len(pairs)} adapted "
                        "modules have no DoRA magnitude; export the adapter again.")


def _check_every_layer(pairs: dict[str, dict[str, _Tensor]], targets: list[str], declared: DeclaredModel,
                       base_model: str, problems: list[str]) -> None:
    """Every layer of every declared target adapted: a hole means a partial export."""
    names = [t for t in dict.fromkeys(targets) if t in declared.modules]  # a repeated name counts once
    found = {(int(m.group(1)), module.rsplit(".", 1)[-1]) for module in pairs if (m := _LAYER.search("." + module + "."))}
    missing = [f"layer {layer} {name}" for layer in range(declared.num_layers) for name in names
               if (layer, name) not in found]
    if missing:
        problems.append(f"{WEIGHTS_NAME} has no LoRA weights for {len(missing)} of the {declared.num_layers} x "
                        f"{len(names)} adapted modules of {base_model} (first: {', '.join(missing[:3])}); "
                        "the export is incomplete, so export the adapter again.")


def _check_finite(weights: _Member, tensors: list[_Tensor], problems: list[str], name: str = WEIGHTS_NAME) -> None:
    """Every value finite, read from the stream in order (the header check made the tensors cover
    the data section exactly): at most _CHUNK bytes of the weights are held at a time."""
    for t in sorted(tensors, key=lambda t: t.start):
        _, unsigned, exponent = DTYPES[t.dtype]
        item = DTYPES[t.dtype][0]
        left, bad = t.end - t.start, 0
        while left:
            chunk = weights.read_exactly(min(left, _CHUNK - _CHUNK % item))
            if chunk is None:
                problems.append(f"{name} ends inside tensor {t.name}; the file is truncated, so export "
                                "it again.")
                raise _Stop
            bits = np.frombuffer(chunk, dtype=unsigned)
            bad += int(np.count_nonzero((bits & exponent) == exponent))
            left -= len(chunk)
        if bad:
            problems.append(f"{t.name} holds {bad} NaN or infinite value(s); training diverged, so lower the "
                            "learning rate or check the data and train again.")
