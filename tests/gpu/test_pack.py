"""tools/gpu/pack.py's choice of wheels for the device machine, without the network."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tools.gpu.pack import DEVICE, EXTRA, pins, requires, slim, wanted


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


def test_slim_keeps_the_cuda_major_and_cpu_libraries_and_installs_with_no_index(tmp_path: Path) -> None:
    """bitsandbytes' one wheel holds a native library per runtime (43 MB for 0.50.2): the device's CUDA 13
    ones and the CPU's are kept, the RECORD matches what is left, and pip installs it with no index."""
    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    libraries = ["cpu", "cuda118", "cuda128", "cuda130", "cuda132", "rocm64", "xpu2026"]
    files = {"bitsandbytes/__init__.py": "__version__ = '0.50.2'\n",
             **{f"bitsandbytes/libbitsandbytes_{r}.so": r * 1000 for r in libraries},
             "bitsandbytes-0.50.2.dist-info/METADATA": "Metadata-Version: 2.1\nName: bitsandbytes\nVersion: 0.50.2\n",
             "bitsandbytes-0.50.2.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + "bitsandbytes-0.50.2.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr("bitsandbytes-0.50.2.dist-info/RECORD", record)
    kept, removed = slim(wheel, "13")
    assert [Path(k).name for k in kept] == ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so",
                                            "libbitsandbytes_cuda132.so"]
    assert len(removed) == 4
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        listed = {line.split(",")[0] for line in zf.read("bitsandbytes-0.50.2.dist-info/RECORD").decode().splitlines()}
    assert names == listed and set(kept) <= names and not set(removed) & names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                    "--no-deps", "--target", str(target), str(wheel)], check=True)
    assert sorted(p.name for p in (target / "bitsandbytes").glob("*.so")) == [Path(k).name for k in kept]
