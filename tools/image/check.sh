#!/usr/bin/env bash
# make image-check: the training image built from this repository's Dockerfile and run for real.
#   1. the stand-in base image (tools/image/base.sh; no registry is reachable here)
#   2. the image (tools/image/build.sh: buildah, this machine's pip configuration), and its size
#   3. smoke checks inside it (tools/image/smoke.sh)
#   4. real trainings through its ENTRYPOINT: an AWS launch on moto, its user data executed by the
#      played machine, `docker run` played by `buildah run` of this image with the same env file and
#      data volume, against a control plane the test starts (tests/e2e/test_image_e2e.py): the
#      LoRA trainer on the tiny test model and the smoke trainer, each to `succeeded`
# Then the image is removed (the base image is kept for the next check). Needs root, buildah,
# podman and mmdebstrap (Debian packages; .ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ "$(id -u)" != "0" ]]; then
    # buildah's chroot isolation needs root: where sudo works without a password, run as root.
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        exec sudo -n --preserve-env=CI,IMAGE_CHECK_TAG,PATH "$0" "$@"
    fi
    echo "image-check: needs root (buildah --isolation chroot); run it as root or with passwordless sudo" >&2
    exit 1
fi
tag=${IMAGE_CHECK_TAG:-localhost/tensorant-trainer:check}
python=.venv/bin/python
total=$SECONDS

for tool in buildah podman mmdebstrap; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "image-check: $tool is missing (apt-get install buildah podman mmdebstrap)" >&2
        exit 1
    fi
done
trap 'echo "image-check: removing $tag"; tools/image/clean.sh "$tag" >/dev/null 2>&1 || true' EXIT

stage() {  # name command...
    local name=$1 start=$SECONDS
    shift
    echo "[image-check] $name..."
    "$@"
    echo "[image-check] $name: done in $((SECONDS - start)) s"
}

stage "1/4 base image (Debian bookworm, Python 3.11, standing in for python:3.11-slim)" tools/image/base.sh
stage "2/4 building $tag from the Dockerfile" tools/image/build.sh "$tag"
size=$(buildah images --format '{{.Size}}' "$tag" | head -1)
echo "[image-check] image size: $size"
stage "3/4 smoke checks inside the image" tools/image/smoke.sh "$tag"
log=$(mktemp)
stage "4/4 trainings through the image's entrypoint (played AWS bootstrap)" \
    env TENSORANT_IMAGE_CHECK="$tag" "$python" -m pytest tests/e2e/test_image_e2e.py -p no:cacheprovider -s -rA \
    2>&1 | tee "$log" | grep -E "image-check:|PASSED|FAILED|SKIPPED|ERROR|passed|failed|Error"
if ! grep -qE "^=* ?2 passed" "$log"; then
    echo "image-check: the trainings through the image did not both pass; the test's output:" >&2
    tail -n 150 "$log" >&2
    exit 1
fi
rm -f "$log"
echo "[image-check] all done in $((SECONDS - total)) s; image size $size"
