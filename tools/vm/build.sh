#!/usr/bin/env bash
# Builds the vm-check machine's root filesystem once: Debian bookworm with a kernel, systemd,
# cloud-init and Docker Engine, as a cloud image has them (tools/vm/README.md).
#   tools/vm/build.sh        # prints the root filesystem's folder; skips when it is built
# Cached under .tensorant/vm/<recipe hash>/rootfs, the hash of this file's lines that are not
# comments: a changed recipe builds a new one (the old folder stays until tools/vm/clean.sh). Built into a temporary folder and
# renamed when complete, so a build cut short is never taken for a built one.
# Measured here (2 cores, busy): mmdebstrap about 8 min, 1.1 GB.
set -euo pipefail
cd "$(dirname "$0")/../.."

recipe=$(grep -v '^ *#' tools/vm/build.sh | sha256sum | cut -c1-16)
dest=.tensorant/vm/$recipe
if [[ -f $dest/rootfs/.tensorant-vm-built ]]; then
    echo "$dest/rootfs"
    exit 0
fi
for tool in mmdebstrap; do
    command -v "$tool" >/dev/null || { echo "vm build: $tool is not installed (apt-get install $tool)" >&2; exit 3; }
done
[[ $(id -u) == 0 ]] || { echo "vm build: needs root (mmdebstrap builds a bootable tree with device nodes)" >&2; exit 3; }

mkdir -p "$dest"
work=$(mktemp -d "$dest/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS
echo "vm build: mmdebstrap bookworm (kernel, systemd, cloud-init, docker.io; about 8 min here)..." >&2
# The hooks (run by mmdebstrap's shell, "$1" the tree):
# - apparmor: the kernel enables AppArmor, and Docker then refuses to start a container without
#   apparmor_parser ("the docker-default profile could not be loaded"), as on Ubuntu's cloud images;
# - the root file system on the first virtio disk (QEMU boots the kernel directly, no boot loader);
# - the guest's registry, 10.0.2.100:5000, is plain HTTP on QEMU's loopback forward (insecure-registries);
# - a no-op NVIDIA prestart hook, kept out of PATH: Docker accepts `--gpus` only where
#   nvidia-container-runtime-hook is found, so a case links it into /usr/local/bin (a "GPU host"
#   without a GPU) or leaves it out (the engine's own exit 125, the real no-runtime case);
# - apt's and man-db's timers masked: they would take the guest's CPU during a case.
# shellcheck disable=SC2016
mmdebstrap --variant=apt \
    --include=linux-image-amd64,systemd-sysv,cloud-init,docker.io,apparmor,curl,ca-certificates,iproute2,ifupdown,isc-dhcp-client,udev \
    --customize-hook='echo "/dev/vda / ext4 defaults 0 1" > "$1/etc/fstab"' \
    --customize-hook='mkdir -p "$1/etc/docker" && echo "{\"insecure-registries\": [\"10.0.2.100:5000\"]}" > "$1/etc/docker/daemon.json"' \
    --customize-hook='mkdir -p "$1/usr/local/lib/tensorant-vm" && printf "#!/bin/sh\n# vm-check: a GPU host without a GPU. Docker runs this as the OCI prestart hook of --gpus.\ncat >/dev/null\nexit 0\n" > "$1/usr/local/lib/tensorant-vm/nvidia-container-runtime-hook" && chmod 755 "$1/usr/local/lib/tensorant-vm/nvidia-container-runtime-hook"' \
    --customize-hook='for u in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer; do ln -sf /dev/null "$1/etc/systemd/system/$u"; done' \
    --customize-hook='echo tensorant-vm > "$1/etc/hostname"' \
    bookworm "$work/rootfs" >"$work/mmdebstrap.log" 2>&1 \
    || { tail -50 "$work/mmdebstrap.log" >&2; exit 1; }
touch "$work/rootfs/.tensorant-vm-built"
rm -rf "$dest/rootfs"
mv "$work/rootfs" "$dest/rootfs"
echo "vm build: done in $((SECONDS - start)) s ($(du -sh "$dest/rootfs" | cut -f1))" >&2
echo "$dest/rootfs"
