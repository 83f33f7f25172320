#!/usr/bin/env bash
# Builds localhost/tensorant-base:py311, a stand-in for python:3.11-slim, when it is absent.
# Why: no registry is reachable on the development machines, so docker.io/python:3.11-slim cannot
# be pulled; Debian bookworm ships Python 3.11 as python:3.11-slim does, and mmdebstrap builds its
# root filesystem from the Debian mirror. The Dockerfile itself is unchanged: build.sh passes
# --build-arg BASE_IMAGE=<this image>.
#   tools/image/base.sh            # skips when the image exists
#   BASE_IMAGE=localhost/x:y tools/image/base.sh
set -euo pipefail

image=${BASE_IMAGE:-localhost/tensorant-base:py311}
suite=${DEBIAN_SUITE:-bookworm}

if podman image exists "$image"; then
    echo "base: $image exists, nothing to do (tools/image/clean.sh --all removes it)"
    exit 0
fi
for tool in mmdebstrap podman; do
    command -v "$tool" >/dev/null || { echo "base: $tool is not installed (apt-get install $tool)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS

echo "[1/2] base: mmdebstrap $suite minbase + python3, pip, venv, ca-certificates (about 2-3 min)..."
# Hooks shape the tree like python:3.11-slim: `python` and `pip` on PATH, and pip allowed to install
# into the system Python (Debian marks it EXTERNALLY-MANAGED, PEP 668; the official image does not).
# "$1" in a hook is the root filesystem being built.
# shellcheck disable=SC2016  # the hooks are expanded by mmdebstrap's shell, not this one
mmdebstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    --customize-hook='ln -sf /usr/bin/python3 "$1/usr/local/bin/python"' \
    --customize-hook='ln -sf /usr/bin/pip3 "$1/usr/local/bin/pip"' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    "$suite" "$work/rootfs.tar" >"$work/mmdebstrap.log" 2>&1 \
    || { cat "$work/mmdebstrap.log" >&2; exit 1; }
echo "      done in $((SECONDS - start)) s ($(du -h "$work/rootfs.tar" | cut -f1) tar)"

step=$SECONDS
echo "[2/2] base: podman import as $image..."
# The same image config as python:3.11-slim: PATH, a UTF-8 locale, and python3 as the default command.
podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$image" >/dev/null
echo "      done in $((SECONDS - step)) s"
echo "base: $image built in $((SECONDS - start)) s, size $(podman images --format '{{.Size}}' "$image")"
