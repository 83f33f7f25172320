"""verify_adapter on the smoke adapter and on crafted bad archives: each is rejected with
the explanation a user can act on."""

from __future__ import annotations

import hashlib
import io
import json
import stat
import struct
import zipfile

import pytest

from adapter_format.smoke import CONFIG_NAME, MANIFEST_NAME, WEIGHTS_NAME, build_adapter_files, write_safetensors
from adapter_format.verify import VerifyResult, verify_adapter
from tests.support.adapters import build_adapter_zip, lora_shapes, zip_files

TINY = "tensorant/smoke-tiny"


def check(data: bytes, *, base_model: str = TINY, expected: str | None = None, **limits: int) -> VerifyResult:
    return verify_adapter(data, base_model=base_model, expected_sha256=expected, **limits)  # type: ignore[arg-type]


def rejected(result: VerifyResult, *fragments: str) -> None:
    assert not result.ok
    text = " | ".join(result.problems)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_smoke_adapter_passes(dtype: str) -> None:
    data = build_adapter_zip(TINY, dtype=dtype, rows=12)
    result = check(data, expected=hashlib.sha256(data).hexdigest())
    assert result.ok, result.problems
    assert result.problems == []
    assert result.summary["r"] == 8 and result.summary["modules"] == 4 and result.summary["tensors"] == 8
    assert result.summary["rows"] == 12 and result.summary["dtypes"] == [dtype]


def test_real_model_shapes_pass_and_undeclared_models_are_noted() -> None:
    data = build_adapter_zip("meta-llama/Llama-3.2-1B")
    result = check(data, base_model="meta-llama/Llama-3.2-1B")
    assert result.ok, result.problems
    assert result.summary["modules"] == 64  # 16 layers x q/k/v/o
    # An adapter for an undeclared model: shapes are checked for consistency only.
    files = build_adapter_files(TINY)
    config = json.loads(files[CONFIG_NAME]) | {"base_model_name_or_path": "acme/private-7b"}
    files[CONFIG_NAME] = json.dumps(config).encode()
    files[MANIFEST_NAME] = json.dumps({"base_model": "acme/private-7b"}).encode()
    result = check(zip_files(files), base_model="acme/private-7b")
    assert result.ok, result.problems
    assert result.summary["base_model_declared"] is False


def test_checksum_mismatch() -> None:
    data = build_adapter_zip(TINY)
    rejected(check(data, expected="0" * 64), "not the " + "0" * 64, "upload the adapter again")


def test_not_a_zip() -> None:
    rejected(check(b"PK\x03\x04 definitely not a zip"), "not a readable zip archive")


def test_zip_bomb_high_ratio() -> None:
    data = build_adapter_zip(TINY, extra={"padding.bin": b"\0" * (8 * 1024 * 1024)})
    rejected(check(data), "'padding.bin' expands", "zip bomb")


def test_entry_lying_about_its_size_is_cut_off() -> None:
    # The headers claim 10 bytes; the data inflates to 2 MiB. Declared sizes are never trusted.
    data = bytearray(build_adapter_zip(TINY, extra={"liar.bin": b"\0" * (2 * 1024 * 1024)}))
    zf = zipfile.ZipFile(io.BytesIO(bytes(data)))
    central = bytes(data).find(b"liar.bin", zf.start_dir) - 46  # its central directory record
    struct.pack_into("<I", data, central + 24, 10)
    struct.pack_into("<I", data, zf.getinfo("liar.bin").header_offset + 22, 10)  # and its local header
    rejected(check(bytes(data)), "'liar.bin'")


def test_dotdot_path() -> None:
    rejected(check(build_adapter_zip(TINY, extra={"../evil.sh": b"x"})), "'../evil.sh' climbs out", "relative paths")


def test_absolute_path() -> None:
    rejected(check(build_adapter_zip(TINY, extra={"/etc/cron.d/evil": b"x"})), "is an absolute path")


def test_symlink_entry() -> None:
    buf = io.BytesIO(build_adapter_zip(TINY))
    with zipfile.ZipFile(buf, "a") as zf:
        info = zipfile.ZipInfo("link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    rejected(check(buf.getvalue()), "'link' is a symbolic link")


def test_duplicate_entry() -> None:
    buf = io.BytesIO(build_adapter_zip(TINY))
    with pytest.warns(UserWarning), zipfile.ZipFile(buf, "a") as zf:
        zf.writestr(CONFIG_NAME, b"{}")
    rejected(check(buf.getvalue()), f"'{CONFIG_NAME}' appears twice")


def test_too_many_entries() -> None:
    extra = {f"notes/{i}.txt": b"x" for i in range(70)}
    rejected(check(build_adapter_zip(TINY, extra=extra)), "73 entries, more than the 64 allowed")


def test_total_size_limit() -> None:
    rejected(check(build_adapter_zip(TINY), max_total_bytes=1000), "more than the 1000 allowed")


@pytest.mark.parametrize("name", [CONFIG_NAME, WEIGHTS_NAME, MANIFEST_NAME])
def test_missing_file(name: str) -> None:
    rejected(check(build_adapter_zip(TINY, missing=[name])), f"no {name} at its top level")


def test_files_inside_a_folder() -> None:
    files = build_adapter_files(TINY)
    data = zip_files({f"adapter/{name}": content for name, content in files.items()})
    rejected(check(data), "inside a folder; put the adapter files at the top level")


def test_truncated_safetensors_header() -> None:
    good = build_adapter_files(TINY)[WEIGHTS_NAME]
    (length,) = struct.unpack("<Q", good[:8])
    rejected(check(build_adapter_zip(TINY, weights=good[: 8 + length // 2])), "the file is truncated")
    rejected(check(build_adapter_zip(TINY, weights=b"\x01\x02")), "too short to hold a safetensors header")


def test_oversized_header_length() -> None:
    weights = struct.pack("<Q", 10**12) + b"{}"
    rejected(check(build_adapter_zip(TINY, weights=weights)), "declares a 1000000000000-byte header")


def test_bad_tensor_entries() -> None:
    raw = b"\0" * 16
    weights = write_safetensors({"x.lora_A.weight": ("I64", [2], raw)})
    rejected(check(build_adapter_zip(TINY, weights=weights)), "dtype 'I64'")
    weights = write_safetensors({"x.lora_A.weight": ("F32", [2, 4], raw)})  # 8 values need 32 bytes
    rejected(check(build_adapter_zip(TINY, weights=weights)), "has 16 bytes of data but shape [2, 4]")
    # Offsets pointing past the data section.
    header = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    rejected(check(build_adapter_zip(TINY, weights=struct.pack("<Q", len(header)) + header + b"\0" * 8)),
             "outside the 8-byte data section")
    # Overlapping tensors.
    header = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
    rejected(check(build_adapter_zip(TINY, weights=struct.pack("<Q", len(header)) + header + b"\0" * 12)),
             "overlaps or leaves gaps")


def test_shape_mismatch() -> None:
    rejected(check(build_adapter_zip(TINY, wrong_rank=True)),
             "layers.0.self_attn.q_proj: lora_A [8, 64] and lora_B [64, 9] do not have the rank r = 8")


def test_shapes_of_another_model() -> None:
    # Consistent rank, but the in/out sizes are the tiny model's, not Llama's.
    data = build_adapter_zip(TINY, config_overrides={"base_model_name_or_path": "meta-llama/Llama-3.2-1B"})
    result = check(data, base_model="meta-llama/Llama-3.2-1B")
    rejected(result, "do not fit meta-llama/Llama-3.2-1B, whose q_proj maps 2048 -> 2048",
             "manifest.json names base model 'tensorant/smoke-tiny'")


def test_missing_lora_b() -> None:
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": ("F32", [8, 64], b"\0" * 2048)}
    data = build_adapter_zip(TINY, weights=write_safetensors(tensors))
    rejected(check(data), "has lora_A but no lora_B for base_model.model.model.layers.0.self_attn.q_proj")


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_nan_value(dtype: str) -> None:
    rejected(check(build_adapter_zip(TINY, nan=True, dtype=dtype)),
             "q_proj.lora_A.weight holds 1 NaN or infinite value(s)")


def test_wrong_base_model() -> None:
    rejected(check(build_adapter_zip(TINY), base_model="meta-llama/Llama-3.2-1B"),
             "names base model 'tensorant/smoke-tiny', but this run trains 'meta-llama/Llama-3.2-1B'")


@pytest.mark.parametrize(("override", "fragment"), [
    ({"peft_type": "IA3"}, "peft_type 'IA3'"),
    ({"r": 0}, "r = 0"),
    ({"r": "8"}, "r = '8'"),
    ({"lora_alpha": -1}, "lora_alpha = -1"),
    ({"target_modules": []}, "target_modules = []"),
    ({"base_model_name_or_path": None}, "names base model None"),
])
def test_config_not_sane(override: dict[str, object], fragment: str) -> None:
    rejected(check(build_adapter_zip(TINY, config_overrides=override)), fragment)


def test_config_not_json() -> None:
    files = build_adapter_files(TINY)
    files[CONFIG_NAME] = b"{not json"
    rejected(check(zip_files(files)), f"{CONFIG_NAME} is not valid JSON")


def test_manifest_checksum_mismatch() -> None:
    files = build_adapter_files(TINY)
    config = json.loads(files[CONFIG_NAME]) | {"lora_alpha": 32}
    files[CONFIG_NAME] = json.dumps(config).encode()  # changed after the manifest was written
    rejected(check(zip_files(files)), f"{CONFIG_NAME} does not match the sha256 in manifest.json")


# ---------------------------------------------------------------- provider, writestr, real PEFT layouts


def test_smoke_adapter_refused_off_local() -> None:
    data = build_adapter_zip(TINY)
    assert verify_adapter(data, base_model=TINY, expected_sha256=None, provider="local", smoke_allowed_on=("local",)).ok
    assert verify_adapter(data, base_model=TINY, expected_sha256=None).ok  # provider unknown: not checked
    for provider in ("aws", "azure", "runpod"):
        rejected(verify_adapter(data, base_model=TINY, expected_sha256=None, provider=provider),
                 "written by the smoke trainer", f"not {provider!r}")


def test_writestr_entries_without_file_type_bits_are_files() -> None:
    # zipfile.writestr(name, data) stores mode 0o600 with no S_IFREG bit; Windows tools store 0.
    files = build_adapter_files(TINY)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, content in files.items():
            zf.writestr(name, content)
        zf.writestr("notes/", b"")  # a real directory entry is fine
    assert {i.external_attr >> 16 for i in zipfile.ZipFile(buf).infolist() if not i.is_dir()} == {0o600}
    assert check(buf.getvalue()).ok, check(buf.getvalue()).problems
    plain = io.BytesIO()
    with zipfile.ZipFile(plain, "w") as zf:
        for name, content in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0
            zf.writestr(info, content)
    assert check(plain.getvalue()).ok


@pytest.mark.parametrize(("attr", "fragment"), [
    ((stat.S_IFDIR | 0o755) << 16, "is marked as a directory but named like a file"),
    (0o644 << 16 | 0x10, "is marked as a directory but named like a file"),  # the MS-DOS directory bit
    ((stat.S_IFIFO | 0o644) << 16, "is not a regular file"),
    ((stat.S_IFLNK | 0o777) << 16, "is a symbolic link"),
])
def test_links_and_directories_posing_as_files(attr: int, fragment: str) -> None:
    files = build_adapter_files(TINY)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, content in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = attr if name == CONFIG_NAME else 0o644 << 16
            zf.writestr(info, content)
    rejected(check(buf.getvalue()), f"'{CONFIG_NAME}' {fragment}")


def _peft_files(base_model: str, targets: list[str], r: int = 4, skip: int = 0) -> dict[str, bytes]:
    """An adapter laid out as PEFT saves it: attention under self_attn, gate/up/down under mlp."""
    import numpy as np

    from adapter_format.base_models import get_base_model
    from adapter_format.smoke import adapter_config, manifest_bytes

    spec = get_base_model(base_model)
    assert spec is not None
    rng = np.random.default_rng(0)

    def values(shape: tuple[int, int]) -> bytes:  # random: constant bytes would compress like a zip bomb
        return rng.normal(0, 0.01, size=shape).astype("<f4").tobytes()

    tensors: dict[str, tuple[str, list[int], bytes]] = {}
    for layer in range(spec.num_layers):
        for module in targets:
            if skip and layer == 0 and module == targets[0]:
                continue
            block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            (a, b) = lora_shapes(spec, r, [module])[module]
            key = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{key}.lora_A.weight"] = ("F32", list(a), values(a))
            tensors[f"{key}.lora_B.weight"] = ("F32", list(b), values(b))
    files = {CONFIG_NAME: json.dumps(adapter_config(base_model, r, sorted(targets))).encode(),
             WEIGHTS_NAME: write_safetensors(tensors, {"format": "pt"})}
    files[MANIFEST_NAME] = manifest_bytes(base_model, files, rows=1, trainer="lora")
    return files


ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_all_linear_peft_layout_with_q_dim_not_hidden() -> None:
    result = verify_adapter(zip_files(_peft_files("tensorant/tiny-llama", ALL)), base_model="tensorant/tiny-llama",
                            expected_sha256=None, provider="aws")
    assert result.ok, result.problems
    assert result.summary["modules"] == 14
    big = verify_adapter(zip_files(_peft_files("meta-llama/Llama-3.1-8B-Instruct", ALL, r=1)),
                         base_model="meta-llama/Llama-3.1-8B-Instruct", expected_sha256=None, provider="runpod")
    assert big.ok, big.problems


def test_mlp_shapes_and_missing_layers_are_checked() -> None:
    # The tiny Qwen2's adapter under the tiny Llama's name: same hidden and MLP sizes, but the Llama's
    # q/o use q_dim = 4 heads x 32 = 128, not 64.
    files = _peft_files("tensorant/tiny-qwen2", ALL)
    config = json.loads(files[CONFIG_NAME]) | {"base_model_name_or_path": "tensorant/tiny-llama"}
    files[CONFIG_NAME] = json.dumps(config).encode()
    files[MANIFEST_NAME] = json.dumps({"base_model": "tensorant/tiny-llama"}).encode()
    rejected(verify_adapter(zip_files(files), base_model="tensorant/tiny-llama", expected_sha256=None),
             "q_proj: lora_A [4, 64] and lora_B [64, 4] do not fit tensorant/tiny-llama, whose q_proj maps 64 -> 128",
             "o_proj maps 128 -> 64")
    rejected(check(zip_files(_peft_files("tensorant/tiny-llama", ALL, skip=1)), base_model="tensorant/tiny-llama"),
             "no LoRA weights for 1 of the 2 x 7 adapted modules", "layer 0 q_proj")
