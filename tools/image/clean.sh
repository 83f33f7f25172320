#!/usr/bin/env bash
# Removes a built training image and the working containers made from it (smoke.sh's, or any
# `buildah from` of it), then the untagged intermediate images that `buildah bud --layers` keeps.
#   tools/image/clean.sh [TAG]          # default TAG: localhost/tensorant-trainer:check
#   tools/image/clean.sh [TAG] --all    # the stand-in base image too (base.sh builds it again)
set -euo pipefail

tag=localhost/tensorant-trainer:check
all=false
for arg in "$@"; do
    case $arg in
        --all) all=true ;;
        -*) echo "usage: $0 [TAG] [--all]" >&2; exit 2 ;;
        *) tag=$arg ;;
    esac
done
base=${BASE_IMAGE:-localhost/tensorant-base:py311}

remove_image() {
    local image=$1 id
    if ! id=$(buildah inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null); then
        echo "clean: no image $image"
        return 0
    fi
    # Working containers of the image first: an image in use cannot be removed.
    buildah containers --format '{{.ContainerID}} {{.ImageID}}' | while read -r container image_id; do
        if [[ $image_id == "$id" ]]; then
            buildah rm "$container" >/dev/null && echo "clean: removed working container $container"
        fi
    done
    buildah rmi "$image" >/dev/null && echo "clean: removed $image"
}

remove_image "$tag"
# Untagged layers of earlier builds (the pip install step's is about 1.3 GB).
buildah rmi --prune >/dev/null 2>&1 || true
if $all; then
    remove_image "$base"
fi
