"""Smoke adapter archives for tests, valid or broken on purpose, from adapter_format.smoke's files: the
verifier is tested on exactly what the smoke trainer writes, with only the intended corruption wrong."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterable

from adapter_format.base_models import DeclaredModel, get_base_model
from adapter_format.smoke import (
    CONFIG_NAME,
    MANIFEST_NAME,
    SMOKE_TRAINER,
    WEIGHTS_NAME,
    build_adapter_files,
    manifest_bytes,
    smoke_weights,
)

_FIXED_TIME = (2026, 1, 1, 0, 0, 0)  # same inputs -> same archive bytes


def lora_shapes(model: DeclaredModel, r: int, targets: Iterable[str]) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """module -> (lora_A shape [r, in], lora_B shape [out, r])."""
    return {t: ((r, model.modules[t][0]), (model.modules[t][1], r)) for t in targets}


def _declared(base_model: str) -> DeclaredModel:
    model = get_base_model(base_model)
    assert model is not None, f"{base_model!r} is not declared in adapter_format.base_models"
    return model


def zip_files(entries: dict[str, bytes], *, compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = compression
            info.external_attr = 0o100644 << 16  # a regular file
            zf.writestr(info, data)
    return buf.getvalue()


def build_adapter_zip(
    base_model: str = "tensorant/smoke-tiny",
    *,
    rows: int = 0,
    r: int = 8,
    dtype: str = "F32",
    seed: int = 0,
    config_overrides: dict[str, object] | None = None,
    nan: bool = False,
    wrong_rank: bool = False,
    missing: Iterable[str] = (),
    extra: dict[str, bytes] | None = None,
    weights: bytes | None = None,
    trainer: str = SMOKE_TRAINER,
    measured: dict[str, float] | None = None,
    model: DeclaredModel | None = None,
) -> bytes:
    """A valid smoke adapter archive, or a broken one for tests (every corruption off by default).

    config_overrides: keys replaced in adapter_config.json (None as a value deletes the key).
    nan: a NaN in the first lora_A tensor. wrong_rank: the first lora_B has rank r+1.
    missing: file names left out. extra: raw entries added as they are (e.g. "../evil").
    weights: replaces adapter_model.safetensors with these bytes.
    trainer: the manifest's trainer name; tests whose fake machine plays the real trainer's
    output on a cloud provider say "lora" (the verifier refuses "smoke" there).
    measured: figures a real trainer's manifest carries (train_seconds, tokens, steps), for the forecast's check.
    The manifest lists the files as they end up in the archive, so only the intended
    corruption is wrong.
    """
    files = build_adapter_files(base_model, rows=rows, r=r, dtype=dtype, seed=seed, model=model)
    if config_overrides:
        files[CONFIG_NAME] = _overridden(files[CONFIG_NAME], config_overrides)
    if nan or wrong_rank:
        files[WEIGHTS_NAME] = smoke_weights(model or _declared(base_model), r=r, dtype=dtype, seed=seed, nan=nan,
                                              wrong_rank=wrong_rank)
    if weights is not None:
        files[WEIGHTS_NAME] = weights
    payload = {name: data for name, data in files.items() if name != MANIFEST_NAME}
    files[MANIFEST_NAME] = manifest_bytes(base_model, payload, rows=rows, trainer=trainer, measured=measured)
    for name in missing:
        files.pop(name, None)
    files.update(extra or {})
    return zip_files(files)


def _overridden(config_raw: bytes, overrides: dict[str, object]) -> bytes:
    """adapter_config.json with keys replaced (None as a value deletes the key)."""
    config = json.loads(config_raw)
    for key, value in overrides.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return json.dumps(config, indent=2).encode()
