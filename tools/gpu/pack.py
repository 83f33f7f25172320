"""Pack the wheels the GPU check needs that the device machine lacks, for a machine with no network.

    .venv/bin/python -m tools.gpu.pack                      # .gpu-wheels/ for the device (cp312, manylinux x86_64)
    .venv/bin/python -m tools.gpu.pack --dest D --python-version 3.11 --have have.txt   # another target

What the trainer imports (machine/trainer/requirements.txt) plus what the check's TRL comparison
imports (trl and its needs), minus what the machine already has at the pinned version (DEVICE: the
device tool's package list, KINDS.md, read 2026-11), then the closure of their Requires-Dist over
the names the machine lacks. torch is never packed: it is GBs, and the check uses the machine's own
(torch 2.11 + CUDA 13 there) and prints that it does. Everything must fit BUDGET (a device call
carries 64 MiB in all, the checkout included); OPTIONAL wheels (bitsandbytes) are packed only when
they are found and fit, else the check skips its 4-bit and 8-bit optimizer cases and says why.
bitsandbytes 0.50.2 is one 43 MB wheel holding a native library per CUDA, ROCm and XPU version (CUDA
11.8 to 13.2); it is packed slimmed to the libraries of the device's CUDA major version (13: torch
2.11 + cu130 there loads libbitsandbytes_cuda130.so) and the CPU one, its RECORD rewritten to match:
about 7 MB, the same package files otherwise (SLIM; --cuda-major for another target).
Writes `pack.json` beside the wheels: what was packed, slimmed, left out and why.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUDGET = 60 * 2**20
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
EXTRA = ["trl==1.16.0"]  # the check's TRL comparison (never a dependency of the project)
OPTIONAL = ["bitsandbytes==0.50.2"]  # 4-bit loading and adamw_8bit on CUDA
NEVER = {"torch", "triton"}  # the machine's own: far over the budget
# Wheels that carry a native library per accelerator runtime: (the libraries' file name pattern, the part of it
# that names the runtime; kept where it is CUDA of the target's major version, or the CPU).
SLIM = {"bitsandbytes": re.compile(r"^bitsandbytes/libbitsandbytes_(?P<runtime>[a-z]+\d*)\.so$")}
CUDA_MAJOR = "13"  # the device's torch 2.11.0+cu130
# The device machine's Python packages (KINDS.md, "pip list" and "Python packages already there"):
# a version where it was read, "" where only the name was.
DEVICE = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "tokenizers": "0.23.2", "torch": "2.11.0", "transformers": "5.17.0", "triton": "3.6.0",
    **{name: "" for name in (
        "aiohttp", "anyio", "attrs", "certifi", "charset-normalizer", "click", "filelock", "fsspec", "h11",
        "hf-xet", "httpcore", "httpx", "idna", "jinja2", "markupsafe", "mpmath", "multidict", "networkx",
        "packaging", "pandas", "psutil", "pyarrow", "python-dateutil", "pyyaml", "regex", "requests", "rich",
        "sentencepiece", "shellingham", "six", "sympy", "tqdm", "typer", "typing-extensions", "urllib3",
        "xxhash", "yarl", "protobuf", "pillow", "markdown-it-py", "mdurl", "pygments", "tzdata", "pytz",
        "aiosignal", "frozenlist", "propcache", "aiohappyeyeballs", "setuptools")},
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    lines = (REPO / "machine" / "trainer" / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def read_have(path: str) -> dict[str, str]:
    """name==version lines (pip freeze), or bare names."""
    have = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            have[canonical(name)] = version
    return have


def wanted(requirement: str, have: dict[str, str]) -> bool:
    name, _, version = requirement.partition("==")
    name = canonical(re.split(r"[<>=!~ ;\[]", name)[0])
    if name in NEVER:
        return False
    if name not in have:
        return True
    return bool(version) and have[name] not in ("", version)


def requires(wheel: Path) -> list[str]:
    """The wheel's unconditional Requires-Dist (no extras; markers other than extras kept as pip would
    evaluate them for Linux: the few that are python_version ones are dropped)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req, _, marker = line.split(":", 1)[1].strip().partition(";")
        if "extra" in marker or "python_version" in marker or "sys_platform == \"win32\"" in marker:
            continue
        out.append(req.replace(" ", "").replace("(", "").replace(")", ""))
    return out


def slim(wheel: Path, cuda_major: str) -> tuple[list[str], list[str]]:
    """Rewrite wheel in place without the native libraries of other runtimes than CUDA cuda_major.x and
    the CPU (SLIM), its RECORD without their lines; returns (kept, removed) library paths."""
    pattern = SLIM[canonical(wheel.name.split("-")[0])]
    keep = re.compile(rf"^(cpu|cuda{cuda_major}\d)$")
    staged = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as dst:
        libraries = [(i.filename, m["runtime"]) for i in src.infolist() if (m := pattern.match(i.filename))]
        kept = [name for name, runtime in libraries if keep.match(runtime)]
        removed = {name for name, runtime in libraries if not keep.match(runtime)}
        for info in src.infolist():
            if info.filename in removed:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in data.decode().splitlines(keepends=True)
                               if line.split(",")[0] not in removed).encode()
            dst.writestr(info, data)
    staged.replace(wheel)
    return kept, sorted(removed)


def download(requirement: str, dest: Path, python_version: str, platforms: tuple[str, ...]) -> Path | None:
    before = set(dest.glob("*.whl"))
    plat = [arg for p in platforms for arg in ("--platform", p)]
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "--disable-pip-version-check", "--python-version", python_version, "--implementation",
                           "cp", *plat, "-d", str(dest), requirement], capture_output=True, text=True)
    new = set(dest.glob("*.whl")) - before
    if proc.returncode != 0 or not new:
        return None
    return new.pop()


def pack(dest: Path, *, python_version: str, platforms: tuple[str, ...], have: dict[str, str],
         budget: int = BUDGET, cuda_major: str = CUDA_MAJOR) -> dict[str, object]:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    packed: dict[str, str] = {}
    left_out: dict[str, str] = {}
    slimmed: dict[str, str] = {}
    queue = [r for r in pins() + EXTRA if wanted(r, have)]
    seen = {canonical(re.split(r"[<>=!~\[]", r)[0]) for r in queue}
    while queue:
        requirement = queue.pop(0)
        wheel = download(requirement, dest, python_version, platforms)
        if wheel is None:
            raise SystemExit(f"pack: no wheel for {requirement} (python {python_version}, {platforms[0]})")
        packed[requirement] = wheel.name
        for need in requires(wheel):
            name = canonical(re.split(r"[<>=!~\[]", need)[0])
            if name not in seen and wanted(name, have):
                seen.add(name)
                queue.append(need)
    size = sum(w.stat().st_size for w in dest.glob("*.whl"))
    if size > budget:
        raise SystemExit(f"pack: the required wheels are {size / 2**20:.1f} MiB, over {budget / 2**20:.0f} MiB")
    for requirement in OPTIONAL:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = download(requirement, Path(tmp), python_version, platforms)
            if wheel is not None and canonical(requirement.split("==")[0]) in SLIM:
                before = wheel.stat().st_size
                kept, removed = slim(wheel, cuda_major)
                slimmed[requirement] = (f"{before / 2**20:.1f} -> {wheel.stat().st_size / 2**20:.1f} MiB: kept "
                                        f"{', '.join(Path(k).name for k in kept)}; left out {len(removed)} libraries "
                                        f"of other runtimes")
            if wheel is None:
                left_out[requirement] = f"no wheel for python {python_version} {platforms[0]} on the index"
            elif size + wheel.stat().st_size > budget:
                left_out[requirement] = (f"{wheel.stat().st_size / 2**20:.1f} MiB does not fit: "
                                         f"{size / 2**20:.1f} of {budget / 2**20:.0f} MiB already packed")
            else:
                wheel.rename(dest / wheel.name)
                packed[requirement] = wheel.name
                size += (dest / wheel.name).stat().st_size
    summary = {"python_version": python_version, "platforms": list(platforms), "bytes": size, "packed": packed,
               "slimmed": slimmed, "left_out": left_out, "torch": "not packed: the machine's own is used"}
    (dest / "pack.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dest", default=str(REPO / ".gpu-wheels"))
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--platform", action="append", help="wheel platform tags (default: manylinux x86_64)")
    parser.add_argument("--have", default="", help="the target's packages, name==version lines (default: DEVICE)")
    parser.add_argument("--budget-mib", type=int, default=BUDGET // 2**20)
    parser.add_argument("--cuda-major", default=CUDA_MAJOR, help="the target torch's CUDA major version")
    args = parser.parse_args(argv)
    have = read_have(args.have) if args.have else DEVICE
    summary = pack(Path(args.dest), python_version=args.python_version,
                   platforms=tuple(args.platform or PLATFORMS), have=have, budget=args.budget_mib * 2**20,
                   cuda_major=args.cuda_major)
    packed, left_out, size = summary["packed"], summary["left_out"], summary["bytes"]
    assert isinstance(packed, dict) and isinstance(left_out, dict) and isinstance(size, int)
    print(f"pack: {len(packed)} wheels, {size / 2**20:.1f} MiB in {args.dest}")
    for requirement, how in dict(summary["slimmed"]).items():  # type: ignore[call-overload]
        print(f"pack: slimmed {requirement}: {how}")
    for requirement, why in left_out.items():
        print(f"pack: left out {requirement}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
