"""A damaged archive is refused with a problem, never an exception out of the verifier (an exception
fails the verify-adapter step, which the queue retries and then sets aside as poison). Seeded byte
changes in the zip headers of an adapter and of a merged model found one: a directory record that
claims a newer zip version than zipfile's made zipfile.ZipFile raise NotImplementedError."""

from __future__ import annotations

import hashlib
import json
import random
import re
import struct

import numpy as np

from adapter_format.base_models import BASE_MODELS
from adapter_format.merged import expected_tensors, verify_merged
from adapter_format.smoke import write_safetensors
from adapter_format.verify import verify_adapter
from tests.support.adapters import build_adapter_zip, zip_files

SMOKE = "tensorant/smoke-tiny"


def merged_zip() -> bytes:
    """A merged model of the smoke model that passes (zeros: only the form matters here)."""
    m = BASE_MODELS[SMOKE]
    files = {"config.json": json.dumps({"model_type": m.architecture, "hidden_size": m.hidden_size,
                                        "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
                                        "num_key_value_heads": m.num_kv_heads, "vocab_size": m.vocab_size,
                                        "intermediate_size": m.intermediate_size}).encode(),
             "model.safetensors": write_safetensors({name: ("F32", list(shape), np.zeros(shape, "<f4").tobytes())
                                                     for name, shape in expected_tensors(m).items()})}
    listed = {name: {"sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    files["manifest.json"] = json.dumps({"base_model": SMOKE, "files": listed}).encode()
    return zip_files(files)


def damaged(archive: bytes, records: list[int], rng: random.Random) -> bytes:
    """One to three bytes changed, mostly inside the 46 bytes after a "PK" signature at records (the zip's own
    records)."""
    out = bytearray(archive)
    for _ in range(rng.randrange(1, 4)):
        at = rng.choice(records) + rng.randrange(46) if rng.random() < 0.8 else rng.randrange(len(out))
        out[min(at, len(out) - 1)] = rng.randrange(256)
    return bytes(out)


def test_a_directory_record_of_a_newer_zip_version_is_refused() -> None:
    archive = bytearray(build_adapter_zip(SMOKE, trainer="lora"))
    record = archive.index(b"PK\x01\x02")
    archive[record + 6: record + 8] = struct.pack("<H", 96)  # version needed to extract: 9.6
    result = verify_adapter(bytes(archive), base_model=SMOKE, expected_sha256=None)
    assert result.problems == ["The file is not a readable zip archive (zip file version 9.6); upload the adapter "
                               "as a .zip file."]


def test_damaged_archives_are_refused_never_raised() -> None:
    rng = random.Random(7)
    adapter, merged = build_adapter_zip(SMOKE, trainer="lora"), merged_zip()
    assert verify_adapter(adapter, base_model=SMOKE, expected_sha256=None).ok
    assert verify_merged(merged, base_model=SMOKE, expected_sha256=None).ok
    refused = 0
    for archive, verify, cases in ((adapter, verify_adapter, 600), (merged, verify_merged, 200)):
        records = [m.start() for m in re.finditer(b"PK", archive)]
        for _ in range(cases):
            refused += not verify(damaged(archive, records, rng), base_model=SMOKE, expected_sha256=None).ok
    assert refused > 600  # most changes break the archive (a few land on a date or an unchecked field)
