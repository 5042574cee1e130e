# syntax=docker/dockerfile:1.7
# agl-runtime: agl on a slim Python, as a non-root user. It runs the gateway (`agl gateway serve --in-cluster`) that
# `agl train --on kubernetes` deploys, the rollout controller, and serves as the base of agent images (rollout pods
# need sh, base64, tee, head, tail, wc and cat, which Debian's coreutils provide).
#
# Build from the repository root (the context must hold pyproject.toml):
#   docker build -f docker/agl-runtime.Dockerfile -t ghcr.io/agl-dev/agl-runtime:0.1.0 .
# See docker/README.md for the tags agl expects.

ARG PYTHON_VERSION=3.11

# -- build: a virtual environment with agl and the Kubernetes client (the `k8s` extra) ------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is built from (hatch force-includes templates/ and skills/agent-lightning/).
COPY pyproject.toml README.md ./
COPY agl_cli ./agl_cli
COPY rl_backend ./rl_backend
COPY templates ./templates
COPY skills ./skills
RUN python -m venv /opt/agl && /opt/agl/bin/pip install ".[k8s]"

# -- runtime: the environment alone, no compiler, no sources ----------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm
# 10001: the uid the manifests run as (runAsNonRoot, runAsUser in templates/k8s/provision/); keep the two in step.
RUN groupadd --gid 10001 agl \
 && useradd --uid 10001 --gid 10001 --home-dir /home/agl --create-home --shell /usr/sbin/nologin agl
COPY --from=build /opt/agl /opt/agl
ENV PATH=/opt/agl/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/agl
USER 10001:10001
WORKDIR /home/agl
# The gateway's port in the cluster (GATEWAY_PORT in rl_backend/provision/options.py).
EXPOSE 8090
# Kubernetes sets the command of every container agl renders; this is for `docker run IMAGE`.
CMD ["agl", "--help"]
