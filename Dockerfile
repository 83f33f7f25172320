# The training container: the agent as entrypoint, the real LoRA trainer as its trainer.
#   docker build -t ghcr.io/tensorant/trainer:2026.11 .
# PyPI's torch 2.13.0 wheel bundles the CUDA 13 runtime, so a slim Python base is enough;
# the host needs an NVIDIA driver 580+ and the NVIDIA container toolkit (docker run --gpus all).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/var/cache/huggingface

WORKDIR /opt/tensorant
# One source of truth for the pins; bitsandbytes only here (4-bit needs CUDA, no CPU test uses it).
COPY shared/trainer/requirements.txt /opt/tensorant/requirements.txt
RUN pip install -r /opt/tensorant/requirements.txt bitsandbytes==0.50.2

COPY shared/__init__.py /opt/tensorant/shared/__init__.py
COPY shared/agent/ /opt/tensorant/shared/agent/
COPY shared/trainer/ /opt/tensorant/shared/trainer/

# The trainer runs as its own unprivileged user: it executes the customer's model code (custom
# architectures, chat templates) and must not read the agent's run token or storage credentials.
RUN useradd --system --create-home --uid 10001 trainer \
    && mkdir -p /var/cache/huggingface /workspace/data \
    && chown trainer /var/cache/huggingface

ENV PYTHONPATH=/opt/tensorant \
    TENSORANT_TRAINER_COMMAND="python -m shared.trainer.lora" \
    TENSORANT_TRAINER_USER=trainer

ENTRYPOINT ["python", "-m", "shared.agent"]
