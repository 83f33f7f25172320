#!/usr/bin/env bash
# Checks a built training image by running it with buildah (no Docker engine; `podman run` fails
# here on setrlimit, `buildah run --isolation chroot` works as root):
#   tools/image/smoke.sh [TAG]          # default TAG: localhost/tensorant-trainer:check
# 1. the agent's --help; 2. the trainers' imports; 3. the build left nothing of this machine in the
# image; 4. the smoke trainer writes an adapter; 5. python -m machine.trainer.run (the image's
# TENSORANT_TRAINER_COMMAND) builds tensorant/tiny-llama in $HF_HOME and trains 2 LoRA steps.
# 4 and 5 run as the image's unprivileged trainer user (uid 10001, as the agent runs them), offline,
# with a folder of this machine mounted at /workspace/data as the data volume is.
set -euo pipefail

tag=${1:-localhost/tensorant-trainer:check}
work=$(mktemp -d)
container=$(buildah from --pull-never "$tag")
cleanup() {
    buildah rm "$container" >/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
start=$SECONDS
passed=0

# The data volume: the dataset, the outputs and the Hugging Face cache; the agent makes HF_HOME
# and hands the trainer its folders, so this stands in for that.
data=$work/data
mkdir -p "$data/cache/huggingface" "$data/out-smoke" "$data/out-lora"
for _ in 1 2 3; do
    echo '{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}'
done >"$data/ds.jsonl"
chown -R 10001 "$data"

in_image() {  # in_image [buildah run options] -- command...
    buildah run --isolation chroot -v "$data:/workspace/data" "$@"
}
check() {  # check NAME: after a command that succeeded
    passed=$((passed + 1))
    echo "smoke: ok   $1 ($((SECONDS - start)) s)"
}
fail() {
    echo "smoke: FAIL $1" >&2
    exit 1
}

out=$(in_image "$container" -- python -m machine.agent --help)
grep -q "usage: python -m machine.agent" <<<"$out" || fail "python -m machine.agent --help: $out"
check "python -m machine.agent --help"

in_image "$container" -- python -c \
    "import torch, transformers, peft; import machine.trainer.smoke, machine.trainer.random_model, machine.trainer.run" \
    || fail "imports"
check "import torch, transformers, peft and the trainers"

# shellcheck disable=SC2016  # $p belongs to the shell in the image
in_image "$container" -- sh -c 'for p in /root/.host /etc/pip.conf /etc/xdg/pip /opt/wheels /opt/pypi; do
        [ ! -e "$p" ] || { echo "$p is in the image"; exit 1; }; done' || fail "the build left files of this machine"
check "no pip configuration or mount point of the build machine in the image"

trainer_env=(--user trainer --env HF_HUB_OFFLINE=1 --env TENSORANT_DATASET_PATH=/workspace/data/ds.jsonl)
in_image "${trainer_env[@]}" --env TENSORANT_OUTPUT_DIR=/workspace/data/out-smoke \
    --env TENSORANT_BASE_MODEL=tensorant/smoke-tiny --env TENSORANT_SMOKE_STEP_SECONDS=0 \
    "$container" -- python -m machine.trainer.smoke || fail "the smoke trainer"
for f in adapter_config.json adapter_model.safetensors manifest.json; do
    [[ -s $data/out-smoke/$f ]] || fail "the smoke trainer wrote no $f"
done
check "python -m machine.trainer.smoke wrote an adapter"

# TENSORANT_MODEL_CACHE unset: the model is built under $HF_HOME (the image sets it on the volume).
in_image "${trainer_env[@]}" --env TENSORANT_OUTPUT_DIR=/workspace/data/out-lora \
    --env TENSORANT_BASE_MODEL=tensorant/tiny-llama --env 'TENSORANT_TRAINING={"max_steps":2}' \
    "$container" -- python -m machine.trainer.run || fail "python -m machine.trainer.run"
for f in adapter_config.json adapter_model.safetensors; do
    [[ -s $data/out-lora/$f ]] || fail "machine.trainer.run wrote no $f"
done
[[ -d $data/cache/huggingface/tensorant-models/tensorant--tiny-llama ]] || fail "no model under \$HF_HOME/tensorant-models"
check "python -m machine.trainer.run trained tensorant/tiny-llama (model cached under \$HF_HOME)"

echo "smoke: $passed passed, 0 failed: $tag in $((SECONDS - start)) s"
