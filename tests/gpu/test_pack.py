"""tools/gpu/pack.py's choice of wheels for the device machine, without the network."""

from __future__ import annotations

import zipfile
from pathlib import Path

from tools.gpu.pack import DEVICE, EXTRA, pins, requires, wanted


def test_packs_what_the_device_lacks_or_has_at_another_version_never_torch() -> None:
    chosen = [r.split("==")[0] for r in pins() + EXTRA if wanted(r, DEVICE)]
    # The device has transformers 5.17, tokenizers 0.23.2, huggingface-hub 1.33, numpy 2.5.2: other versions.
    assert chosen == ["transformers", "peft", "tokenizers", "huggingface-hub", "numpy", "gguf", "trl"]
    # accelerate 1.15.0 and safetensors 0.8.0 are there at the pins; torch is the machine's own.
    assert not wanted("torch==2.13.0", {}) and not wanted("accelerate==1.15.0", DEVICE)
    assert wanted("safetensors==0.9.0", DEVICE) and not wanted("pyyaml>=5", DEVICE)


def test_requires_reads_the_unconditional_needs_of_a_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nRequires-Dist: dill (<0.4.2,>=0.3.0)\n"
                    "Requires-Dist: pytest ; extra == \"test\"\nRequires-Dist: multiprocess<0.70.20\n"
                    "Requires-Dist: pywin32 ; sys_platform == \"win32\"\n")
    assert requires(wheel) == ["dill<0.4.2,>=0.3.0", "multiprocess<0.70.20"]
