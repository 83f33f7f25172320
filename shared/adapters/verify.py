"""Strict verification of an adapter archive (docs/architecture.md: verify-adapter).

`verify_adapter(data, base_model=..., expected_sha256=...)` never extracts to disk and
never trusts a size the archive declares: every entry is read in bounded chunks. Each
problem is one sentence that tells the user what is wrong and what to do.

Stages: checksum -> safe unzip -> required files (each stops the later ones when it
fails: no point reading tensors from an archive that is not safe to open) -> config,
manifest, safetensors header -> LoRA pairs and shapes (when the config and header parsed)
and finite values (when the header parsed).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import stat
import struct
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shared.adapters.base_models import get_base_model
from shared.adapters.smoke import CONFIG_NAME, MANIFEST_NAME, SMOKE_TRAINER, WEIGHTS_NAME

REQUIRED = (CONFIG_NAME, WEIGHTS_NAME, MANIFEST_NAME)
MAX_ENTRIES = 64
# Unpacked in memory: at most the archive limit (verify_adapter.MAX_ADAPTER_BYTES), not 2 GiB (issue 11.6).
MAX_TOTAL_BYTES = 1024**3
MAX_RATIO = 100.0
RATIO_FLOOR_BYTES = 1024 * 1024  # a small JSON file may compress well; a bomb is big
MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_JSON_BYTES = 1024 * 1024
_CHUNK = 1024 * 1024
MAX_PROBLEMS = 20
# Providers on which an untrained smoke adapter may pass: the local provider (a developer's own
# machine) and "memory", the in-process test provider of tests/fakes.py. Any cloud run must
# carry a real trainer's adapter: a smoke manifest there means the image ran the wrong trainer.
SMOKE_PROVIDERS = frozenset({"local", "memory"})
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
_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    problems: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


class _Stop(Exception):
    """Raised inside a stage when later checks cannot run."""


def verify_adapter(
    data: bytes,
    *,
    base_model: str,
    expected_sha256: str | None,
    max_entries: int = MAX_ENTRIES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    max_ratio: float = MAX_RATIO,
    provider: str | None = None,
) -> VerifyResult:
    """provider: the run's compute provider; a smoke-trainer adapter is refused unless it is one of
    SMOKE_PROVIDERS. None skips that check (callers that do not know the run)."""
    problems: list[str] = []
    summary: dict[str, Any] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "base_model": base_model}
    try:
        _verify(data, base_model, expected_sha256, max_entries, max_total_bytes, max_ratio, provider, problems,
                summary)
    except _Stop:
        pass
    if len(problems) > MAX_PROBLEMS:  # one broken export can repeat a problem per module
        problems[MAX_PROBLEMS:] = [f"... and {len(problems) - MAX_PROBLEMS} more problems like the ones above."]
    return VerifyResult(ok=not problems, problems=problems, summary=summary)


def _verify(data: bytes, base_model: str, expected_sha256: str | None, max_entries: int, max_total_bytes: int,
            max_ratio: float, provider: str | None, problems: list[str], summary: dict[str, Any]) -> None:
    if expected_sha256 is not None and summary["sha256"] != expected_sha256.lower():
        problems.append(f"The archive's sha256 is {summary['sha256']}, not the {expected_sha256} the agent reported; "
                        "the upload is incomplete or was replaced, so upload the adapter again.")
        raise _Stop
    files = _safe_unzip(data, max_entries, max_total_bytes, max_ratio, problems, summary)
    for name in REQUIRED:
        if name not in files:
            problems.append(f"The archive has no {name} at its top level; an adapter archive needs "
                            f"{', '.join(REQUIRED)}.")
    if problems:
        raise _Stop
    config = _check_config(files[CONFIG_NAME], base_model, problems, summary)
    _check_manifest(files[MANIFEST_NAME], files, base_model, provider, problems, summary)
    tensors = _parse_safetensors(files[WEIGHTS_NAME], problems, summary)
    if tensors is None:
        raise _Stop
    if config is not None:  # a manifest problem need not hide a shape problem: report both
        _check_pairs(config, tensors, base_model, problems, summary)
    _check_finite(files[WEIGHTS_NAME], tensors, problems)


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


def _safe_unzip(data: bytes, max_entries: int, max_total_bytes: int, max_ratio: float,
                problems: list[str], summary: dict[str, Any]) -> dict[str, bytes]:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        problems.append(f"The file is not a readable zip archive ({exc}); upload the adapter as a .zip file.")
        raise _Stop from exc
    infos = zf.infolist()
    summary["entries"] = len(infos)
    if len(infos) > max_entries:
        problems.append(f"The archive has {len(infos)} entries, more than the {max_entries} allowed; "
                        "zip only the adapter files.")
        raise _Stop
    seen: set[str] = set()
    for info in infos:
        name = info.filename
        why = _unsafe_name(name)
        if why:
            problems.append(f"Archive entry {name!r} {why}; rebuild the archive with plain relative paths.")
        # Unix mode in the high 16 bits. zipfile.writestr(name, data) writes 0o600 with no file-type
        # bits at all, and Windows tools write 0: both are plain files. A link, device, FIFO or socket
        # type is refused, and so is a directory (Unix type or DOS attribute) whose name does not end
        # in "/", which zipfile would otherwise read as a file.
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        is_dir_attr = stat.S_ISDIR(mode) or bool(info.external_attr & _DOS_DIRECTORY)
        if stat.S_ISLNK(mode):
            problems.append(f"Archive entry {name!r} is a symbolic link; zip the files themselves, not links.")
        elif kind and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            problems.append(f"Archive entry {name!r} is not a regular file; zip only regular files.")
        elif is_dir_attr and not name.endswith("/"):
            problems.append(f"Archive entry {name!r} is marked as a directory but named like a file; "
                            "zip only regular files.")
        elif name.endswith("/") and info.file_size:
            problems.append(f"Archive entry {name!r} is a directory that holds data; rebuild the archive.")
        if name in seen:
            problems.append(f"Archive entry {name!r} appears twice; keep one copy of each file.")
        seen.add(name)
        if info.flag_bits & 0x1:
            problems.append(f"Archive entry {name!r} is encrypted; upload an unencrypted archive.")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            problems.append(f"Archive entry {name!r} uses compression method {info.compress_type}; "
                            "use plain deflate or no compression.")
        if info.file_size >= RATIO_FLOOR_BYTES and info.file_size > max_ratio * max(info.compress_size, 1):
            problems.append(f"Archive entry {name!r} expands {info.file_size} bytes from {info.compress_size} "
                            f"(more than {max_ratio:.0f}:1), which looks like a zip bomb; it was not unpacked.")
    if problems:
        raise _Stop
    declared_total = sum(i.file_size for i in infos)
    if declared_total > max_total_bytes:
        problems.append(f"The archive unpacks to {declared_total} bytes, more than the {max_total_bytes} allowed.")
        raise _Stop
    files: dict[str, bytes] = {}
    total = 0
    for info in infos:
        if info.is_dir():
            continue
        chunks: list[bytes] = []
        size = 0
        try:
            with zf.open(info) as member:
                # Bounded reads: stop as soon as an entry outgrows what it declared, the total
                # budget, or the ratio, whatever its header claims.
                while chunk := member.read(_CHUNK):
                    size += len(chunk)
                    total += len(chunk)
                    if size > info.file_size or total > max_total_bytes:
                        problems.append(f"Archive entry {info.filename!r} unpacks to more than it declares or "
                                        "than the size allowed; rebuild the archive.")
                        raise _Stop
                    if size >= RATIO_FLOOR_BYTES and size > max_ratio * max(info.compress_size, 1):
                        problems.append(f"Archive entry {info.filename!r} expands more than {max_ratio:.0f}:1, "
                                        "which looks like a zip bomb; it was not unpacked.")
                        raise _Stop
                    chunks.append(chunk)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
            problems.append(f"Archive entry {info.filename!r} is damaged ({exc}); upload the archive again.")
            raise _Stop from exc
        files[info.filename] = b"".join(chunks)
    summary["files"] = sorted(files)
    summary["unpacked_bytes"] = total
    nested = [n for n in files if "/" in n and n.rsplit("/", 1)[1] in REQUIRED]
    if nested:
        problems.append(f"{nested[0]} is inside a folder; put the adapter files at the top level of the archive.")
        raise _Stop
    return files


# ---------------------------------------------------------------- config and manifest


def _load_json(raw: bytes, name: str, problems: list[str]) -> dict[str, Any] | None:
    if len(raw) > MAX_JSON_BYTES:
        problems.append(f"{name} is {len(raw)} bytes, more than the {MAX_JSON_BYTES} allowed for a JSON file.")
        return None
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{name} is not valid JSON ({exc}); write it with json.dump.")
        return None
    if not isinstance(value, dict):
        problems.append(f"{name} must hold a JSON object, not {type(value).__name__}.")
        return None
    return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_config(raw: bytes, base_model: str, problems: list[str], summary: dict[str, Any]) -> dict[str, Any] | None:
    config = _load_json(raw, CONFIG_NAME, problems)
    if config is None:
        return None
    before = len(problems)
    if config.get("peft_type") != "LORA":
        problems.append(f"{CONFIG_NAME} has peft_type {config.get('peft_type')!r}; only LoRA adapters "
                        "(peft_type \"LORA\") are accepted.")
    r = config.get("r")
    if not (isinstance(r, int) and not isinstance(r, bool) and r > 0):
        problems.append(f"{CONFIG_NAME} has r = {r!r}; the LoRA rank must be a whole number above 0.")
    alpha = config.get("lora_alpha")
    if not (isinstance(alpha, int | float) and not isinstance(alpha, bool) and math.isfinite(alpha) and alpha > 0):
        problems.append(f"{CONFIG_NAME} has lora_alpha = {alpha!r}; it must be a number above 0.")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        valid_targets = bool(targets)
    else:
        valid_targets = (isinstance(targets, list) and bool(targets)
                         and all(isinstance(t, str) and t for t in targets))
    if not valid_targets:
        problems.append(f"{CONFIG_NAME} has target_modules = {targets!r}; name the modules LoRA adapts "
                        "(for example [\"q_proj\", \"v_proj\"]).")
    found = config.get("base_model_name_or_path")
    if found != base_model:
        problems.append(f"{CONFIG_NAME} names base model {found!r}, but this run trains {base_model!r}; "
                        "train the adapter on the run's base model.")
    rank_pattern = config.get("rank_pattern") or {}
    if not isinstance(rank_pattern, dict) or not all(_is_int(v) and v > 0 for v in rank_pattern.values()):
        problems.append(f"{CONFIG_NAME} has an invalid rank_pattern; it must map module names to ranks above 0.")
    summary.update(r=r, lora_alpha=alpha, target_modules=targets)
    return config if len(problems) == before else None


def _check_manifest(raw: bytes, files: dict[str, bytes], base_model: str, provider: str | None,
                    problems: list[str], summary: dict[str, Any]) -> None:
    manifest = _load_json(raw, MANIFEST_NAME, problems)
    if manifest is None:
        return
    if manifest.get("trainer") == SMOKE_TRAINER and provider is not None and provider not in SMOKE_PROVIDERS:
        problems.append(f"{MANIFEST_NAME} says the adapter was written by the smoke trainer, which trains nothing; "
                        f"it is accepted only on the local provider, not {provider!r}. Run the real trainer "
                        "(the training image's default TENSORANT_TRAINER_COMMAND).")
    if "base_model" in manifest and manifest["base_model"] != base_model:
        problems.append(f"{MANIFEST_NAME} names base model {manifest['base_model']!r}, but this run trains "
                        f"{base_model!r}.")
    listed = manifest.get("files", {})
    if not isinstance(listed, dict):
        problems.append(f"{MANIFEST_NAME} has a 'files' entry that is not an object of name -> {{sha256}}.")
        listed = {}
    for name, entry in listed.items():
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if name not in files:
            problems.append(f"{MANIFEST_NAME} lists {name}, which is not in the archive; the export is incomplete.")
        elif digest is not None and hashlib.sha256(files[name]).hexdigest() != digest:
            problems.append(f"{name} does not match the sha256 in {MANIFEST_NAME}; the file changed after "
                            "training wrote it, so export the adapter again.")
    summary.update(trainer=manifest.get("trainer"), rows=manifest.get("rows"))


# ---------------------------------------------------------------- safetensors


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offsets in the file
    end: int


def _parse_safetensors(raw: bytes, problems: list[str], summary: dict[str, Any]) -> list[_Tensor] | None:
    name = WEIGHTS_NAME
    if len(raw) < 8:
        problems.append(f"{name} is {len(raw)} bytes, too short to hold a safetensors header; export it again.")
        return None
    (header_len,) = struct.unpack("<Q", raw[:8])
    if header_len > MAX_HEADER_BYTES:
        problems.append(f"{name} declares a {header_len}-byte header, more than the {MAX_HEADER_BYTES} allowed; "
                        "the file is corrupt or not a safetensors file.")
        return None
    if 8 + header_len > len(raw):
        problems.append(f"{name} declares a {header_len}-byte header but the file is only {len(raw)} bytes; "
                        "the file is truncated, so export it again.")
        return None
    try:
        header = json.loads(raw[8:8 + header_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{name} has a header that is not valid JSON ({exc}); the file is corrupt.")
        return None
    if not isinstance(header, dict):
        problems.append(f"{name} has a header that is not a JSON object; the file is corrupt.")
        return None
    base = 8 + header_len
    buffer_len = len(raw) - base
    tensors: list[_Tensor] = []
    before = len(problems)
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict):
            problems.append(f"{name}: tensor {key} has a malformed header entry.")
            continue
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPES:
            problems.append(f"{name}: tensor {key} has dtype {dtype!r}; save the adapter as F32, F16 or BF16.")
            continue
        if (not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)):
            problems.append(f"{name}: tensor {key} has a malformed shape or data_offsets.")
            continue
        start, end = offsets
        if not 0 <= start <= end <= buffer_len:
            problems.append(f"{name}: tensor {key} points at bytes {start}..{end} outside the {buffer_len}-byte "
                            "data section; the file is truncated or corrupt.")
            continue
        expected = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype][0] if shape else DTYPES[dtype][0]
        if end - start != expected:
            problems.append(f"{name}: tensor {key} has {end - start} bytes of data but shape {shape} in {dtype} "
                            f"needs {expected}; the file is corrupt.")
            continue
        tensors.append(_Tensor(key, dtype, tuple(shape), base + start, base + end))
    if len(problems) != before:
        return None
    # The data section must be covered exactly, in order: no gaps, no overlaps, nothing after.
    position = base
    for t in sorted(tensors, key=lambda t: (t.start, t.end)):
        if t.start != position:
            problems.append(f"{name}: tensor {t.name} starts at byte {t.start - base}, not {position - base}; tensor "
                            "data overlaps or leaves gaps, so the file is corrupt.")
            return None
        position = t.end
    if position != len(raw):
        problems.append(f"{name} has {len(raw) - position} bytes after the last tensor; the file is corrupt.")
        return None
    summary["tensors"] = len(tensors)
    summary["dtypes"] = sorted({t.dtype for t in tensors})
    return tensors


# ---------------------------------------------------------------- LoRA pairs


def _rank_for(module: str, config: dict[str, Any]) -> int:
    for pattern, rank in (config.get("rank_pattern") or {}).items():
        if re.search(rf"(^|\.){pattern}$", module):
            return int(rank)
    return int(config["r"])


def _targeted(module: str, targets: str | list[str]) -> bool:
    if targets == "all-linear":  # PEFT's shorthand, when a config keeps it unexpanded
        return True
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return module.rsplit(".", 1)[-1] in targets


def _check_pairs(config: dict[str, Any], tensors: list[_Tensor], base_model: str, problems: list[str],
                 summary: dict[str, Any]) -> None:
    declared = get_base_model(base_model)
    summary["base_model_declared"] = declared is not None
    pairs: dict[str, dict[str, _Tensor]] = {}
    for t in tensors:
        match = _LORA_KEY.match(t.name)
        if match is None:
            problems.append(f"{WEIGHTS_NAME} holds {t.name}, which is not a lora_A/lora_B weight; "
                            "save only the LoRA adapter weights.")
            continue
        pairs.setdefault(match["module"], {})[match["ab"]] = t
    if not pairs and not problems:
        problems.append(f"{WEIGHTS_NAME} holds no LoRA weights; the export wrote an empty adapter.")
    targets = config["target_modules"]
    for module, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            have = next(iter(pair))
            want = "B" if have == "A" else "A"
            problems.append(f"{WEIGHTS_NAME} has lora_{have} but no lora_{want} for {module}; every adapted "
                            "module needs both.")
            continue
        a, b = pair["A"], pair["B"]
        short = module.rsplit(".", 1)[-1]
        if not _targeted(module, targets):
            problems.append(f"{WEIGHTS_NAME} adapts {module}, which is not in target_modules {targets!r}.")
        if len(a.shape) != 2 or len(b.shape) != 2:
            problems.append(f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} must both be 2-D.")
            continue
        rank = _rank_for(module, config)
        if a.shape[0] != rank or b.shape[1] != rank:
            problems.append(f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not have the "
                            f"rank r = {rank} from {CONFIG_NAME} (expected A [r, in] and B [out, r]).")
            continue
        if declared is not None:
            dims = declared.modules.get(short)
            layer = _LAYER.search("." + module + ".")
            if layer and int(layer.group(1)) >= declared.num_layers:
                problems.append(f"{module}: {base_model} has only {declared.num_layers} layers.")
            if dims is None:
                problems.append(f"{module}: {base_model} has no module {short!r} that a LoRA adapter can target "
                                f"(known: {', '.join(sorted(declared.modules))}).")
            elif (a.shape[1], b.shape[0]) != dims:
                problems.append(f"{module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit "
                                f"{base_model}, whose {short} maps {dims[0]} -> {dims[1]}; was it trained on "
                                "another model?")
    summary["modules"] = len(pairs)
    if declared is not None and isinstance(targets, list) and not problems:
        # Every layer of every declared target should be adapted: a hole means a partial export.
        names = [t for t in targets if t in declared.modules]
        found = {(int(m.group(1)), module.rsplit(".", 1)[-1]) for module in pairs if (m := _LAYER.search("." + module + "."))}
        missing = [f"layer {layer} {name}" for layer in range(declared.num_layers) for name in names
                   if (layer, name) not in found]
        if missing:
            problems.append(f"{WEIGHTS_NAME} has no LoRA weights for {len(missing)} of the {declared.num_layers} x "
                            f"{len(names)} adapted modules of {base_model} (first: {', '.join(missing[:3])}); "
                            "the export is incomplete, so export the adapter again.")


def _check_finite(raw: bytes, tensors: list[_Tensor], problems: list[str]) -> None:
    view = memoryview(raw)
    for t in tensors:
        _, unsigned, exponent = DTYPES[t.dtype]
        bits = np.frombuffer(view[t.start:t.end], dtype=unsigned)
        bad = int(np.count_nonzero((bits & exponent) == exponent))
        if bad:
            problems.append(f"{t.name} holds {bad} NaN or infinite value(s); training diverged, so lower the "
                            "learning rate or check the data and train again.")
