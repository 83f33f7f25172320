#!/usr/bin/env bash
# The training container vm-check pulls inside the VM: the Dockerfile's entrypoint and code (the
# agent, the adapters, the trainers) on Debian bookworm's Python 3.11 with python3-numpy, without
# the Dockerfile's pinned torch stack (several GB: a pull of it under QEMU's emulation takes longer
# than a case may). The smoke trainer is what it runs; tools/image builds and checks the real image.
#   tools/vm/container.sh      # prints the image name; skips when it is built
# The name carries a hash of the code and of this recipe, so a code change builds a new image.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in mmdebstrap podman buildah; do
    command -v "$tool" >/dev/null || { echo "vm container: $tool is not installed (apt-get install $tool)" >&2; exit 3; }
done
base=localhost/tensorant-vm-base:$(grep -v '^ *#' tools/vm/container.sh | sha256sum | cut -c1-12)
code=$( { grep -v '^ *#' tools/vm/container.sh; tar -c --sort=name --mtime=@0 --owner=0 --group=0 --exclude=__pycache__ \
    machine/__init__.py adapter_format machine/agent machine/trainer; } | sha256sum | cut -c1-12)
image=localhost/tensorant-vm-trainer:$code
if podman image exists "$image"; then echo "$image"; exit 0; fi

start=$SECONDS
if ! podman image exists "$base"; then
    echo "vm container: base $base (mmdebstrap minbase, python3, python3-numpy; about 2 min)..." >&2
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # shellcheck disable=SC2016
    mmdebstrap --variant=minbase --include=python3,python3-numpy,ca-certificates \
        --customize-hook='ln -sf /usr/bin/python3 "$1/usr/local/bin/python"' \
        bookworm "$work/rootfs.tar" >"$work/mmdebstrap.log" 2>&1 || { tail -30 "$work/mmdebstrap.log" >&2; exit 1; }
    podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' "$work/rootfs.tar" "$base" >/dev/null
fi
# The Dockerfile's user, environment and entrypoint (trainer: the smoke trainer, no torch here).
ctr=$(buildah from --quiet "$base")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah run --isolation chroot "$ctr" -- sh -c 'useradd --system --create-home --uid 10001 trainer && mkdir -p /workspace/data /opt/tensorant/machine'
for part in machine/__init__.py adapter_format machine/agent machine/trainer; do
    buildah copy --quiet "$ctr" "$part" "/opt/tensorant/$part" >/dev/null
done
buildah run --isolation chroot "$ctr" -- find /opt/tensorant -name __pycache__ -prune -exec rm -rf {} +
buildah config --workingdir /opt/tensorant \
    --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 --env PYTHONPATH=/opt/tensorant \
    --env HF_HOME=/workspace/data/cache/huggingface \
    --env "TENSORANT_TRAINER_COMMAND=python -m machine.trainer.smoke" --env TENSORANT_TRAINER_USER=trainer \
    --entrypoint '["python", "-m", "machine.agent"]' --cmd '' "$ctr"
buildah commit --quiet --format docker "$ctr" "$image" >/dev/null
echo "vm container: $image built in $((SECONDS - start)) s" >&2
echo "$image"
