"""The verifier and DoRA adapters (use_dora): a magnitude vector [out] per adapted module is accepted
only when adapter_config.json says use_dora, and only of the right shape, for every adapted module."""

from __future__ import annotations

import json

import numpy as np

from adapter_format.smoke import build_adapter_files, manifest_bytes, write_safetensors
from adapter_format.verify import CONFIG_NAME, MANIFEST_NAME, WEIGHTS_NAME, VerifyResult, verify_adapter
from tests.support.adapters import zip_files

TINY = "tensorant/smoke-tiny"  # 2 layers, q_proj and v_proj of 64 -> 64


def dora(*, use_dora: bool, out: int = 64, skip: int = 0) -> VerifyResult:
    files = build_adapter_files(TINY)
    raw = files[WEIGHTS_NAME]
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8: 8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]: v["data_offsets"][1]]) for k, v in header.items()}
    modules = sorted({k.removesuffix(".lora_A.weight") for k in tensors if k.endswith(".lora_A.weight")})
    for module in modules[skip:]:
        tensors[f"{module}.lora_magnitude_vector"] = ("F32", [out], np.ones(out, dtype="<f4").tobytes())
    config = json.loads(files[CONFIG_NAME])
    config["use_dora"] = use_dora
    files = {CONFIG_NAME: json.dumps(config).encode(), WEIGHTS_NAME: write_safetensors(tensors, {"format": "pt"})}
    files[MANIFEST_NAME] = manifest_bytes(TINY, files, rows=0, trainer="smoke")
    return verify_adapter(zip_files(files), base_model=TINY, expected_sha256=None)


def test_dora_magnitudes_accepted_with_use_dora() -> None:
    got = dora(use_dora=True)
    assert got.ok, got.problems


def test_dora_magnitudes_refused_without_use_dora_or_of_the_wrong_shape() -> None:
    assert any("lora_magnitude_vector, which is not a lora_A/lora_B weight" in p for p in dora(use_dora=False).problems)
    assert any("must have one value per output feature" in p for p in dora(use_dora=True, out=63).problems)
    missing = dora(use_dora=True, skip=1).problems
    assert any("1 of the 4 adapted modules have no DoRA magnitude" in p for p in missing), missing
