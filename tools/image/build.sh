#!/usr/bin/env bash
# Builds the training image from the Dockerfile with buildah, without a Docker engine:
#   tools/image/build.sh [TAG]          # default TAG: localhost/tensorant-trainer:check
#   BASE_IMAGE=python:3.11-slim TRAINER_LOCK=machine/trainer/image-requirements.txt \
#       tools/image/build.sh ghcr.io/tensorant/trainer:2026.11
# BASE_IMAGE defaults to the local stand-in from tools/image/base.sh (no registry reachable here);
# TRAINER_LOCK (the hashed lock the Dockerfile installs with --require-hashes) to the CPU torch one,
# machine/trainer/image-requirements-cpu.txt: the CUDA lock's torch and NVIDIA wheels are not on this disk.
#
# pip inside the build resolves as pip on this machine (so torch==2.13.0 is the CPU wheel on this
# machine's disk): this machine's pip configuration (files and PIP_* variables, as `pip config list`
# shows them) is merged into one pip.conf, and it and the local paths it names (wheel folders,
# file:// indexes, constraints, CA bundle) are mounted read-only for the RUN steps only. All of it
# goes under /root (the build's HOME: pip reads ~/.config/pip/pip.conf), mounted from a temporary
# folder here: mount points created inside it land in that folder, not in the image, so the image
# keeps no trace of this machine (mounting at the same paths left empty /opt/wheels, /etc/pip.conf
# ... in the image). Where pip has no configuration (GitHub CI) nothing is mounted.
# Each build line is prefixed with the seconds since the start (the time per step).
set -euo pipefail

cd "$(dirname "$0")/../.."
tag=${1:-localhost/tensorant-trainer:check}
base=${BASE_IMAGE:-localhost/tensorant-base:py311}
lock=${TRAINER_LOCK:-machine/trainer/image-requirements-cpu.txt}
python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python

if [[ $base == localhost/* ]] && ! buildah inspect --type image "$base" >/dev/null 2>&1; then
    echo "build: the base image $base is missing; run tools/image/base.sh first (make image does both)" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mounts=()
if "$python" -m pip --version >/dev/null 2>&1; then
    # Writes $work/home/.config/pip/pip.conf (paths rewritten to /root/.host/<host path>) and the
    # mount points under $work/home/.host; lists "host-path container-path mode" for each mount.
    # Into a file first, so a failure stops the build (set -e) rather than build without the config.
    "$python" - "$work/home" >"$work/mounts" <<'PY'
import ast, configparser, os, subprocess, sys
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

home = Path(sys.argv[1])
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                        check=True).stdout.splitlines()
entries = []
for line in listed:  # section.key='value'; section ":env:" is a PIP_* variable, which wins over files
    name, _, raw = line.partition("=")
    section, _, key = name.rpartition(".")
    if key == "config-file":  # PIP_CONFIG_FILE: the file it names is already in this list
        continue
    entries.append((section == ":env:", "global" if section == ":env:" else section, key, ast.literal_eval(raw)))
mounts = {}

def inside(token):
    """The token with a local path rewritten to where it is mounted (/root/.host/<path>)."""
    url = token.startswith("file:")
    path = url2pathname(urlparse(token).path) if url else token
    if not path.startswith("/"):
        return token
    path = os.path.normpath(path)
    root = os.path.dirname(path) if os.path.basename(path) == "simple" else path  # index pages link ../../files/
    if not os.path.exists(root):
        return token
    stub = home / ".host" / root.lstrip("/")
    if os.path.isdir(root):
        stub.mkdir(parents=True, exist_ok=True)
    else:
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.touch()
    mounts[root] = "/root/.host" + root
    return ("file://" if url else "") + "/root/.host" + path

config = configparser.RawConfigParser()
for _, section, key, value in sorted(entries, key=lambda e: e[0]):
    if not config.has_section(section):
        config.add_section(section)
    config.set(section, key, " ".join(inside(t) for t in value.split()) if value.strip() else value)
if config.sections():
    conf = home / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    with open(conf, "w") as f:
        config.write(f)
    print(home, "/root", "rw")  # first: the mounts below lie inside it; pip may write to its HOME
    for host, target in sorted(mounts.items()):
        print(host, target, "ro")
PY
    while read -r host inside mode; do
        mounts+=(-v "$host:$inside:$mode")
    done <"$work/mounts"
fi
if ((${#mounts[@]})); then
    echo "build: this machine's pip configuration, mounted into the RUN steps:"
    printf '         %s %s\n' "${mounts[@]}"
    sed 's/^/         | /' "$work/home/.config/pip/pip.conf"
fi

if [[ ! -f $lock ]]; then
    echo "build: the lock $lock is missing (TRAINER_LOCK names a file of this repository)" >&2
    exit 1
fi

echo "build: buildah bud $tag from $base with $lock (the pip install step takes minutes the first time)"
start=$SECONDS
# --layers: a rebuild after a code change reuses the pip install layer.
buildah bud --isolation chroot --layers \
    --build-arg "BASE_IMAGE=$base" \
    --build-arg "TRAINER_LOCK=$lock" \
    "${mounts[@]}" \
    -t "$tag" -f Dockerfile . 2>&1 \
    | while IFS= read -r line; do printf '[%4d s] %s\n' $((SECONDS - start)) "$line"; done
status=${PIPESTATUS[0]}
if ((status != 0)); then
    echo "build: failed after $((SECONDS - start)) s" >&2
    exit "$status"
fi
echo "build: $tag built in $((SECONDS - start)) s, size $(buildah images --format '{{.Size}}' "$tag" | head -1)"
