"""The adapter verifier (its input is the trainer's output: untrusted) never compiles a pattern from
the archive, bounds its work, and checks a zip's entry count before zipfile reads the central directory."""

from __future__ import annotations

import io
import json
import re
import struct
import time
import zipfile
from typing import Any

import numpy as np
import pytest

from adapter_format import verify
from adapter_format.smoke import (
    CONFIG_NAME,
    MANIFEST_NAME,
    WEIGHTS_NAME,
    adapter_config,
    build_adapter_files,
    manifest_bytes,
    write_safetensors,
)
from adapter_format.verify import VerifyResult, verify_adapter
from tests.support.adapters import build_adapter_zip, zip_files

TINY = "tensorant/smoke-tiny"
PRIVATE = "acme/private-7b"  # undeclared: shapes are checked for consistency only
# (a+)+ against this name backtracks 2^30 ways before it fails at "!" (27 characters froze the
# verifier for 12.5 s).
EVIL_MODULE = "a" * 30 + "!"


def rejected(result: VerifyResult, *fragments: str) -> None:
    assert not result.ok
    text = " | ".join(result.problems)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


def private_archive(modules: dict[str, int], **config: object) -> bytes:
    """An adapter for PRIVATE with a lora_A [rank, 16] / lora_B [16, rank] pair per module."""
    rng = np.random.default_rng(0)
    tensors: dict[str, tuple[str, list[int], bytes]] = {}
    for module, rank in modules.items():
        for ab, shape in (("A", [rank, 16]), ("B", [16, rank])):
            tensors[f"base_model.model.{module}.lora_{ab}.weight"] = (
                "F32", shape, rng.normal(0, 0.01, size=shape).astype("<f4").tobytes())
    files = {CONFIG_NAME: json.dumps(adapter_config(PRIVATE, 8, ["q_proj"]) | config).encode(),
             WEIGHTS_NAME: write_safetensors(tensors, {"format": "pt"})}
    files[MANIFEST_NAME] = manifest_bytes(PRIVATE, files, rows=1, trainer="lora")
    return zip_files(files)


def judge(data: bytes, base_model: str = PRIVATE) -> tuple[VerifyResult, float]:
    start = time.perf_counter()
    result = verify_adapter(data, base_model=base_model, expected_sha256=None)
    return result, time.perf_counter() - start


# ---------------------------------------------------------------- patterns from the archive


def test_redos_target_modules_is_refused_at_once_and_a_list_is_judged() -> None:
    result, seconds = judge(private_archive({EVIL_MODULE: 8}, target_modules="(a+)+"))
    assert seconds < 1.0
    rejected(result, "target_modules = '(a+)+', a regular expression the verifier does not evaluate",
             "write target_modules as a list of module names")
    # The same archive with its target named in a list: judged like any other adapter.
    result, seconds = judge(private_archive({EVIL_MODULE: 8}, target_modules=[EVIL_MODULE]))
    assert seconds < 1.0
    assert result.ok, result.problems
    result, _ = judge(private_archive({EVIL_MODULE: 8}, target_modules=["q_proj"]))
    rejected(result, f"adapts base_model.model.{EVIL_MODULE}, which is not in target_modules ['q_proj']")


def test_redos_in_rank_and_alpha_patterns_is_refused_at_once() -> None:
    for field in ("rank_pattern", "alpha_pattern"):
        result, seconds = judge(private_archive({EVIL_MODULE: 8}, target_modules=[EVIL_MODULE],
                                                **{field: {"(a+)+": 4}}))
        assert seconds < 1.0
        rejected(result, f"{field} key '(a+)+', which is not a module name",
                 "does not evaluate regular expressions")


@pytest.mark.parametrize(("config", "fragment"), [
    ({"target_modules": "("}, "target_modules = '(', a regular expression the verifier does not evaluate"),
    ({"target_modules": "q_proj|.*\\.v_proj"}, "target_modules = 'q_proj|.*\\\\.v_proj', a regular expression"),
    ({"target_modules": ".*self_attn\\.(q_proj|v_proj)"}, "a regular expression the verifier does not evaluate"),
    ({"target_modules": ".*\\." + "(q_proj|" * 200 + ")"}, "a regular expression the verifier does not evaluate"),
    ({"rank_pattern": {"(": 4}}, "rank_pattern key '(', which is not a module name"),
    ({"rank_pattern": {"^q_proj": 4}}, "rank_pattern key '^q_proj', which is not a module name"),
    ({"alpha_pattern": {"q_proj[": 16}}, "alpha_pattern key 'q_proj[', which is not a module name"),
    ({"alpha_pattern": {"q_proj": "16"}}, "invalid alpha_pattern; it must map module names to alphas above 0"),
])
def test_invalid_patterns_are_a_clear_refusal_not_an_exception(config: dict[str, object], fragment: str) -> None:
    # "(" used to raise re.error out of the verifier, and the queue message went to poison.
    rejected(verify_adapter(build_adapter_zip(TINY, config_overrides=config), base_model=TINY,
                            expected_sha256=None), fragment)


@pytest.mark.parametrize(("targets", "ok"), [  # the smoke adapter adapts q_proj and v_proj of 2 layers
    # Lists: PEFT's suffix match on the module's dotted path (not only its last part).
    (["q_proj", "v_proj"], True),
    (["self_attn.q_proj", "layers.0.self_attn.v_proj", "layers.1.self_attn.v_proj"], True),
    (["q_proj", "attn.v_proj"], False),  # "attn" is not a whole part of "self_attn"
    (["q_proj", "layers.0.self_attn.v_proj"], False),  # layer 1's v_proj is adapted but not targeted
    # The string shapes PEFT users write, fullmatched as PEFT does.
    ("all-linear", True),
    (".*\\.(q_proj|v_proj)", True),
    (".*\\.(?:q_proj|v_proj)$", True),
    (".*(q_proj|v_proj)", True),
    (".*\\.q_proj", False),  # v_proj is adapted but not targeted
    ("(q_proj|v_proj)$", False),  # fullmatch: only a top-level module named q_proj or v_proj
])
def test_targets_match_as_peft_matches_them(targets: object, ok: bool) -> None:
    result = verify_adapter(build_adapter_zip(TINY, config_overrides={"target_modules": targets}), base_model=TINY,
                            expected_sha256=None)
    if ok:
        assert result.ok, result.problems
    else:
        rejected(result, "which is not in target_modules")


KEYS = ["model.layers.0.self_attn.q_proj", "model.layers.10.mlp.down_proj", "q_proj", "xq_proj", "model.q_proj_x"]


@pytest.mark.parametrize("pattern", [
    ".*\\.(q_proj|down_proj)", ".*\\.(?:q_proj|down_proj)$", ".*(q_proj|down_proj)", "(q_proj|down_proj)$", "q_proj",
    ".*\\.q_proj", ".*mlp\\.down_proj", ".*\\.layers\\.0\\.self_attn\\.q_proj", "model\\.layers\\.10\\.mlp\\.down_proj",
])
def test_accepted_target_strings_agree_with_re_fullmatch(pattern: str) -> None:
    # The only place a target_modules string is compiled: here, on the fixed shapes the verifier accepts.
    matcher = verify._target_matcher(pattern)
    assert matcher is not None
    for key in KEYS:
        assert matcher(key) == bool(re.fullmatch(pattern, key)), (pattern, key)


def test_rank_pattern_keys_are_literal_dotted_suffixes() -> None:
    files = build_adapter_files(TINY)  # rank 8 everywhere; layer 0 q_proj gets rank 4 below
    header_len = struct.unpack("<Q", files[WEIGHTS_NAME][:8])[0]
    header = json.loads(files[WEIGHTS_NAME][8:8 + header_len])
    rng = np.random.default_rng(1)
    tensors: dict[str, tuple[str, list[int], bytes]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = list(entry["shape"])
        if ".layers.0.self_attn.q_proj." in name:
            shape = [4, shape[1]] if ".lora_A." in name else [shape[0], 4]
        tensors[name] = ("F32", shape, rng.normal(0, 0.01, size=shape).astype("<f4").tobytes())
    weights = write_safetensors(tensors, {"format": "pt"})

    def check(rank_pattern: dict[str, int]) -> VerifyResult:
        data = build_adapter_zip(TINY, weights=weights, config_overrides={"rank_pattern": rank_pattern})
        return verify_adapter(data, base_model=TINY, expected_sha256=None)

    assert check({"layers.0.self_attn.q_proj": 4}).ok
    assert check({"model\\.layers\\.0\\.self_attn\\.q_proj": 4}).ok  # an escaped dot is a dot
    assert check({"layers.0.self_attn.q_proj": 4, "q_proj": 8}).ok
    # The first key that matches wins, as in PEFT: here "q_proj" gives layer 0 rank 8.
    rejected(check({"q_proj": 8, "layers.0.self_attn.q_proj": 4}), "do not have the rank r = 8")
    assert check({"0.self_attn.q_proj": 4}).ok
    rejected(check({"yers.0.self_attn.q_proj": 4}), "do not have the rank r = 8")  # whole parts only


# ---------------------------------------------------------------- bounded work


def test_tensor_count_and_tensor_name_length_are_capped() -> None:
    many = {f"t{i}": ("F32", [0], b"") for i in range(verify.MAX_TENSORS + 1)}
    rejected(verify_adapter(build_adapter_zip(TINY, weights=write_safetensors(many)), base_model=TINY,
                            expected_sha256=None), f"holds {verify.MAX_TENSORS + 1} tensors, more than the "
             f"{verify.MAX_TENSORS} allowed")
    long_name = "base_model.model." + "a." * 300 + "q_proj.lora_A.weight"
    weights = write_safetensors({long_name: ("F32", [8, 64], b"\0" * 2048)})
    rejected(verify_adapter(build_adapter_zip(TINY, weights=weights), base_model=TINY, expected_sha256=None),
             f"has a {len(long_name)}-character name, more than the {verify.MAX_TENSOR_NAME} allowed")


def test_a_long_target_list_and_many_modules_take_linear_time() -> None:
    # Was a scan of the whole list per module: 10,000 modules x 80,000 names took 6 s (now 0.3 s).
    modules = [f"model.layers.{i}.m{i}" for i in range(10_000)]
    targets = [f"n{i}" for i in range(70_000)] + [m.rsplit(".", 1)[1] for m in modules]
    data = private_archive(dict.fromkeys(modules, 1), r=1, target_modules=targets)
    result, seconds = judge(data)
    assert result.ok, result.problems
    assert result.summary["modules"] == 10_000
    assert seconds < 2.5


# ---------------------------------------------------------------- the entry count before the directory


def crafted_zip(records: int, *, count: int | None = None, zip64_count: int | None = None) -> bytes:
    """One empty entry whose central directory record is repeated `records` times; the end record
    declares `count` entries (default: records), or a ZIP64 end record declares `zip64_count`."""
    one = zip_files({"a": b""})
    start = zipfile.ZipFile(io.BytesIO(one)).start_dir
    end = one.rfind(b"PK\x05\x06")
    body, directory = one[:start], one[start:end] * records
    count = records if count is None else count
    if zip64_count is None:
        eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(directory), start, 0)
        return body + directory + eocd
    zip64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, zip64_count, zip64_count, len(directory), start)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, start + len(directory), 1)
    eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return body + directory + zip64 + locator + eocd


def judge_unopened(data: bytes, monkeypatch: pytest.MonkeyPatch) -> VerifyResult:
    """verify_adapter where zipfile.ZipFile must not be built: the refusal comes before zipfile
    parses the central directory."""
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("zipfile.ZipFile was constructed")

    with monkeypatch.context() as patch:
        patch.setattr(zipfile, "ZipFile", refuse)
        return verify_adapter(data, base_model=TINY, expected_sha256=None)


def test_the_crafted_archives_are_what_zipfile_reads() -> None:
    assert len(zipfile.ZipFile(io.BytesIO(crafted_zip(3))).infolist()) == 3
    assert len(zipfile.ZipFile(io.BytesIO(crafted_zip(3, count=1))).infolist()) == 3
    assert len(zipfile.ZipFile(io.BytesIO(crafted_zip(3, zip64_count=400_000))).infolist()) == 3


def test_many_entries_are_refused_before_the_directory_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    result = judge_unopened(crafted_zip(20_000), monkeypatch)
    rejected(result, "The archive has 20000 entries, more than the 64 allowed")
    assert result.summary["entries"] == 20_000
    rejected(judge_unopened(crafted_zip(65), monkeypatch), "has 65 entries, more than the 64 allowed")


def test_an_entry_count_that_lies_is_caught_by_the_directory_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # zipfile reads the directory's declared size, whatever the count says.
    size = len(crafted_zip(20_000, count=1)) - len(crafted_zip(0, count=1))
    rejected(judge_unopened(crafted_zip(20_000, count=1), monkeypatch),
             f"central directory is {size} bytes, more than 64 entries need")


def test_a_zip64_entry_count_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    rejected(judge_unopened(crafted_zip(3, zip64_count=400_000), monkeypatch), "The archive has 400000 entries")


def test_a_good_adapter_with_zip64_end_records_passes() -> None:
    # Rewritten with ZIP64 end records (as a zipper writes past 65,535 entries): the counts are read there.
    plain = build_adapter_zip(TINY)
    start = zipfile.ZipFile(io.BytesIO(plain)).start_dir
    end = plain.rfind(b"PK\x05\x06")
    directory = plain[start:end]
    zip64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 3, 3, len(directory), start)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, end, 1)
    eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    data = plain[:end] + zip64 + locator + eocd
    assert verify._declared_directory(data) == (3, len(directory))
    result = verify_adapter(data, base_model=TINY, expected_sha256=None)
    assert result.ok, result.problems
    assert verify_adapter(data, base_model=TINY, expected_sha256=None, max_entries=2).problems == [
        "The archive has 3 entries, more than the 2 allowed; zip only the adapter files."]


# ---------------------------------------------------------------- every cost bounded (CPU, memory, parse)


def weights_with(count: int, dims: int) -> bytes:
    """`count` F32 tensors of shape [1] * dims: a small file whose header asks for count x dims checks."""
    shape = "[" + ",".join(["1"] * dims) + "]"
    entries = ",".join(f'"t{i}":{{"dtype":"F32","shape":{shape},"data_offsets":[{4 * i},{4 * i + 4}]}}'
                       for i in range(count))
    header = ("{" + entries + "}").encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * (4 * count)


@pytest.mark.parametrize(("count", "dims", "compression", "fragment"), [
    # The archive (28.5 s before): 80 MB of header, refused by its ratio or the header's size cap.
    (20_000, 2_000, zipfile.ZIP_DEFLATED, ""),
    # A header under the size cap, stored (no ratio to refuse): 4,000 x 1,000 dimension checks.
    (4_000, 1_000, zipfile.ZIP_STORED, "has 1000 dimensions, more than the 4"),
])
def test_a_header_of_many_long_shapes_is_refused_in_under_a_second(count: int, dims: int, compression: int,
                                                                   fragment: str) -> None:
    files = build_adapter_files(TINY)
    files[WEIGHTS_NAME] = weights_with(count, dims)
    data = zip_files(files, compression=compression)
    result, seconds = judge(data, TINY)
    print(f"\n{count} tensors of {dims} dimensions ({len(data) / 2**20:.2f} MiB archive): refused in {seconds:.2f} s")
    rejected(result, fragment)
    assert seconds < 1.0


DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize(("target", "payload", "fragment"), [
    (CONFIG_NAME, b'{"peft_type": "LORA", "x": ' + DEEP + b"}", "adapter_config.json is not valid JSON (it nests too"),
    (MANIFEST_NAME, b'{"files": ' + DEEP + b"}", "manifest.json is not valid JSON (it nests too deeply)"),
    (WEIGHTS_NAME, None, "has a header that is not valid JSON (it nests too deeply)"),
    (CONFIG_NAME, b'{"r": ' + b"9" * 5000 + b"}", "Exceeds the limit (4300 digits)"),  # ValueError before
    (CONFIG_NAME, b'{"lora_alpha": 1' + b"0" * 400 + b"}", "has lora_alpha = 1000"),  # OverflowError before
])
def test_deep_nesting_and_huge_integers_are_refused_with_a_reason(target: str, payload: bytes | None,
                                                                  fragment: str) -> None:
    files = build_adapter_files(TINY)
    if payload is None:
        header = b'{"x": ' + DEEP + b"}"
        payload = struct.pack("<Q", len(header)) + header
    files[target] = payload
    rejected(verify_adapter(zip_files(files), base_model=TINY, expected_sha256=None), fragment)


def test_a_huge_measurement_in_the_manifest_is_left_out_of_the_summary() -> None:
    # The forecast's check turns these into floats: a 401-digit int would raise OverflowError in the step.
    files = build_adapter_files(TINY)
    files[MANIFEST_NAME] = b'{"train_seconds": 1' + b"0" * 400 + b', "tokens": 1000}'
    result = verify_adapter(zip_files(files), base_model=TINY, expected_sha256=None)
    assert result.ok and "train_seconds" not in result.summary and result.summary["tokens"] == 1000


def test_a_shape_whose_element_count_overflows_int64_is_refused() -> None:
    # np.prod in int64 wrapped 2**32 x 2**32 to 0 elements (matching an empty tensor), or raised OverflowError.
    for shape in ([2**32, 2**32], [10**17, 10**17]):
        header = json.dumps({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": {
            "dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
        weights = struct.pack("<Q", len(header)) + header
        result = verify_adapter(build_adapter_zip(TINY, weights=weights), base_model=TINY, expected_sha256=None)
        rejected(result, "q_proj.lora_A.weight has")


def test_entries_other_than_the_adapters_are_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1000 MiB of junk beside a good adapter was unpacked (the host went from 0.56 to 2.13 GiB) and the run succeeded.
    data = build_adapter_zip(TINY, extra={"junk.bin": b"\0" * 2 * 2**20, "logs/train.txt": b"x"})
    opened: list[str] = []
    real_open = zipfile.ZipFile.open

    def watched(self: zipfile.ZipFile, name: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(name.filename if isinstance(name, zipfile.ZipInfo) else name)
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", watched)
    result = verify_adapter(data, base_model=TINY, expected_sha256=None)
    rejected(result, "Archive entry 'junk.bin' is not part of an adapter",
             "Archive entry 'logs/train.txt' is not part of an adapter")
    assert opened == []


def big_adapter(n_in: int) -> bytes:
    """A valid adapter for PRIVATE with one q_proj pair of 2 x 8 x n_in F32 values (stored, as the agent zips it)."""
    rng = np.random.default_rng(0)
    module = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {f"{module}.lora_A.weight": ("F32", [8, n_in], rng.normal(0, 0.01, (8, n_in)).astype("<f4").tobytes()),
               f"{module}.lora_B.weight": ("F32", [n_in, 8], rng.normal(0, 0.01, (n_in, 8)).astype("<f4").tobytes())}
    files = {CONFIG_NAME: json.dumps(adapter_config(PRIVATE, 8, ["q_proj"])).encode(),
             WEIGHTS_NAME: write_safetensors(tensors, {"format": "pt"})}
    files[MANIFEST_NAME] = manifest_bytes(PRIVATE, files, rows=1, trainer="lora")
    return zip_files(files, compression=zipfile.ZIP_STORED)


def test_verification_streams_the_weights_within_the_stated_memory_bound(tmp_path: Any) -> None:
    import tracemalloc

    data = big_adapter(1 << 21)  # 2 x 64 MiB of weights
    archive = tmp_path / "adapter.zip"
    archive.write_bytes(data)
    del data
    with archive.open("rb") as f:
        tracemalloc.start()
        try:
            result = verify_adapter(f, base_model=PRIVATE, expected_sha256=None)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result.ok, result.problems
    assert result.summary["unpacked_bytes"] > 128 * 2**20
    print(f"\nverified a {archive.stat().st_size / 2**20:.0f} MiB adapter from a file: peak Python allocation "
          f"{peak / 2**20:.1f} MiB (bound {verify.MEMORY_BOUND_BYTES / 2**20:.0f} MiB)")
    assert peak < verify.MEMORY_BOUND_BYTES  # it held every entry unpacked: over 128 MiB here


class _Counting(io.BytesIO):
    """The archive as a file that counts the bytes read from it."""

    read_bytes = 0

    def read(self, size: int | None = -1) -> bytes:
        got = super().read(size)
        self.read_bytes += len(got)
        return got


def test_a_refused_archive_is_not_inflated_further() -> None:
    """Before: a broken manifest still had the whole weights entry inflated, hashed and scanned (a 36 MB
    archive: 2.3 s of CPU per upload). Now the weights are read past their header only when nothing failed."""
    modules = {f"model.layers.{i}.self_attn.q_proj": 512 for i in range(128)}  # 8 MiB of random weights
    good = zipfile.ZipFile(io.BytesIO(private_archive(modules)))
    files = {name: good.read(name) for name in (CONFIG_NAME, WEIGHTS_NAME)}
    files[MANIFEST_NAME] = b"not json"
    data = zip_files(files)
    source = _Counting(data)
    result = verify_adapter(source, base_model=PRIVATE, expected_sha256=None)
    rejected(result, MANIFEST_NAME)
    # One pass for the archive's sha256, then the directory, the JSON files and the header: far under two.
    assert source.read_bytes < len(data) + 2**20, (source.read_bytes, len(data))
