# The training container: the agent as entrypoint, the real LoRA trainer as its trainer.
#   docker build -t ghcr.io/tensorant/trainer:2026.11 .
# PyPI's torch 2.13.0 wheel bundles the CUDA 13 runtime, so a slim Python base is enough;
# the host needs an NVIDIA driver 580+ and the NVIDIA container toolkit (docker run --gpus all).
# BASE_IMAGE: the published image always uses the default; tools/image/build.sh passes a stand-in
# built from Debian bookworm (same Python 3.11) where no registry is reachable (`make image`).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# HF_HOME: the Hugging Face cache (downloaded base models, tens of GB) lives on the data volume,
# which is kept with the run's disk, not on the container's layer; the agent creates the folder
# at run time, after the volume is mounted at /workspace/data.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    HF_HOME=/workspace/data/cache/huggingface

# TRAINER_LOCK: every package the image installs, pinned with the sha256 of each of its files (`make
# lock`, from the trainer's pins and bitsandbytes): pip refuses any file that differs from the one locked,
# and --no-deps installs nothing the lock does not name. The published image uses the default (CUDA
# torch); tools/image/build.sh passes image-requirements-cpu.txt (the CPU torch wheel) where there is no GPU.
ARG TRAINER_LOCK=machine/trainer/image-requirements.txt

WORKDIR /opt/tensorant
COPY ${TRAINER_LOCK} /opt/tensorant/image-requirements.txt
RUN pip install --no-deps --require-hashes -r /opt/tensorant/image-requirements.txt

# The trainer runs as its own unprivileged user: it executes the customer's model code (custom
# architectures, chat templates) and must not read the agent's run token or storage credentials.
RUN useradd --system --create-home --uid 10001 trainer \
    && mkdir -p /workspace/data

# The code last, so a code change rebuilds only these small layers. adapter_format: the
# declared base models and the adapter format, which the trainers import.
COPY machine/__init__.py /opt/tensorant/machine/__init__.py
COPY adapter_format/ /opt/tensorant/adapter_format/
COPY machine/agent/ /opt/tensorant/machine/agent/
COPY machine/trainer/ /opt/tensorant/machine/trainer/

# machine.trainer.run: prepares the declared tensorant/* test models (random weights) and GGUF
# packages locally when TENSORANT_BASE_MODEL_PATH is not set, then runs machine.trainer.lora.
ENV PYTHONPATH=/opt/tensorant \
    TENSORANT_TRAINER_COMMAND="python -m machine.trainer.run" \
    TENSORANT_TRAINER_USER=trainer \
    TENSORANT_MIN_NVIDIA_DRIVER=580.65.06

ENTRYPOINT ["python", "-m", "machine.agent"]
