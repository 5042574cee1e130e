"""What a provision needs from agl.yaml: the upstream keys the gateway must get, and the project files the
cluster must see.

The cluster's copy of agl.yaml is adapted, not rewritten: `runner: kubernetes` (every rollout is a Job: the
trainer's pod runs no agent), and a `kubernetes:` section with the train's namespace, the in-cluster gateway's URL,
the train's label on every rollout Job (so `agl train stop` finds leftovers), the image rollouts run (see
bundle.py) and the project's ConfigMap, mounted in every rollout pod. Local-only keys go: `kubeconfig` and `context`
(the trainer's pod uses its ServiceAccount), `gateway_listen`, and `network_policy` (the provision renders the
rollout pods' policy itself: the train's Role cannot create one). The files agl.yaml names (tasks, knob files), the
code the rollouts and the grader run, and `--include` ones travel in that ConfigMap, under the same relative paths,
so the spec's relative paths resolve unchanged in every pod.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from rl_backend.gateway.config import UpstreamSpec
from rl_backend.provision.bundle import Program, RolloutSource, check_imports
from rl_backend.provision.options import DEFAULT_KEY_SECRET, LABEL_TRAIN, Names, ProvisionError, SecretRef
from rl_backend.rollout.k8s_spec import KubernetesSpec

PROJECT_DIR = "/etc/agl/project"  # where every pod of a train sees the project (read-only)

# A ConfigMap holds at most 1 MiB (etcd's object limit) including its metadata: leave room for the latter.
MAX_CARRIED_BYTES = 900 * 1024
_DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
SPEC_FILE = "agl.yaml"


@dataclass
class TrainTarget:
    """The parts of an experiment spec a provision uses (built by agl_cli from its ExperimentSpec)."""

    name: str
    config_path: Path
    upstreams: Mapping[str, UpstreamSpec] = field(default_factory=dict)
    kubernetes: KubernetesSpec | None = None
    files: list[str] = field(default_factory=list)  # paths from agl.yaml (tasks, knob files), relative to its folder
    agent: Program = field(default_factory=lambda: Program("agent"))
    grader: Program = field(default_factory=lambda: Program("grader"))

    @property
    def base_dir(self) -> Path:
        return self.config_path.resolve().parent


def key_refs(target: TrainTarget, explicit: list[SecretRef]) -> list[SecretRef]:
    """Every variable an upstream reads its key from, each mapped to a Secret: the one `--key-secret` names, else
    key <ENV> of the Secret `agl-upstream-keys`. Explicit ones for variables no upstream reads are kept (an
    `openai-compatible` upstream may read one the spec does not name)."""
    by_env = {ref.env: ref for ref in explicit}
    refs: list[SecretRef] = []
    for spec in target.upstreams.values():
        env = spec.api_key_env or _DEFAULT_KEY_ENV.get(spec.kind)
        if env and env not in {r.env for r in refs}:
            refs.append(by_env.pop(env, SecretRef(env, DEFAULT_KEY_SECRET, env)))
    return refs + list(by_env.values())


def loopback_upstreams(target: TrainTarget) -> list[str]:
    """Upstreams whose URLs name this machine: from a pod, 127.0.0.1 is the pod itself."""
    found = []
    for name, spec in target.upstreams.items():
        for url in spec.urls():
            host = (urlsplit(url).hostname or "").lower()
            if host in ("localhost", "::1") or host.startswith("127."):
                found.append(f"{name} ({url})")
    return found


def local_key_values(refs: list[SecretRef]) -> list[str]:
    """The values these variables have in agl's own environment: they must never reach a manifest or a log."""
    return [value for ref in refs if len(value := os.environ.get(ref.env, "")) >= 8]


@dataclass
class CarriedFiles:
    """ConfigMap content: `data` (UTF-8 text) and `binary_data` (base64) by key, and the `items` mapping keys to
    relative paths for the volume."""

    data: dict[str, str] = field(default_factory=dict)
    binary_data: dict[str, str] = field(default_factory=dict)
    items: list[dict[str, Any]] = field(default_factory=list)

    def size(self) -> int:
        return sum(len(v.encode()) for v in self.data.values()) + sum(len(v) for v in self.binary_data.values())

    def paths(self) -> list[str]:
        return [item["path"] for item in self.items]


def _key(index: int, relative: str) -> str:
    return f"f{index}-" + re.sub(r"[^-._a-zA-Z0-9]+", "_", relative)[-200:]


def _relative(base: Path, raw: str, what: str) -> tuple[str, Path]:
    path = (base / raw).resolve() if not Path(raw).is_absolute() else Path(raw).resolve()
    try:
        relative = path.relative_to(base.resolve()).as_posix()
    except ValueError:
        raise ProvisionError(
            f"{what} {raw!r} is outside the folder of agl.yaml ({base}): the cluster gets that folder's files only",
            hint="move it next to agl.yaml, or build it into the trainer image and name it by its path there",
            exit_code=2,
        ) from None
    return relative, path


def _walk(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return [path]


def carried_files(target: TrainTarget, names: Names, namespace: str, include: list[str],
                  source: RolloutSource) -> CarriedFiles:
    """agl.yaml (the cluster's copy) plus the files it names, the code rollouts and the grader run, and `--include`,
    checked to fit one ConfigMap and to hold the local modules that code imports."""
    base = target.base_dir
    carried = CarriedFiles()
    carried.items.append({"key": _key(0, SPEC_FILE), "path": SPEC_FILE})
    seen = {SPEC_FILE}
    wanted = [(raw, "a file named in agl.yaml") for raw in target.files]
    wanted += [(raw, "the code rollouts or the grader run") for raw in source.files]
    wanted += [(raw, "--include") for raw in include]
    spec = target.kubernetes
    if spec is not None and spec.job_template:
        # The rollout controller in the trainer's pod renders every Job from it, next to the cluster's agl.yaml.
        wanted.append((spec.job_template, "kubernetes.job_template"))
    for raw, what in wanted:
        relative, path = _relative(base, raw, what)
        if not path.exists():
            raise ProvisionError(f"{what} {raw!r} does not exist ({path})", exit_code=2)
        for file in _walk(path):
            rel = file.relative_to(base.resolve()).as_posix() if file != path else relative
            if rel in seen:
                continue
            seen.add(rel)
            key = _key(len(carried.items), rel)
            content = file.read_bytes()
            try:
                carried.data[key] = content.decode("utf-8")
            except UnicodeDecodeError:
                carried.binary_data[key] = base64.b64encode(content).decode()
            item: dict[str, Any] = {"key": key, "path": rel}
            if file.stat().st_mode & 0o111:
                # A ConfigMap volume's files are 0644 unless the item says: `./agent.sh` must stay executable.
                item["mode"] = EXECUTABLE_MODE
            carried.items.append(item)
    check_imports(base, [p for p in carried.paths() if p.endswith(".py")])
    carried.data[_key(0, SPEC_FILE)] = cluster_spec_text(target, names, namespace, source, carried.items)
    if carried.size() > MAX_CARRIED_BYTES:
        raise ProvisionError(
            f"agl.yaml and the files it names come to {carried.size() // 1024} KiB; a ConfigMap holds at most "
            f"{MAX_CARRIED_BYTES // 1024} KiB",
            hint="build the large files (tasks, data) into the agent's image and name them by their path there",
            exit_code=2,
        )
    return carried


EXECUTABLE_MODE = 0o555  # read and execute for all: the mount is read-only anyway
LOCAL_ONLY_KEYS = ("kubeconfig", "context", "gateway_listen", "network_policy")


def cluster_spec_text(target: TrainTarget, names: Names, namespace: str, source: RolloutSource,
                      items: list[dict[str, Any]]) -> str:
    """The cluster's copy of agl.yaml (see the module docstring)."""
    try:
        data: Any = yaml.safe_load(target.config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ProvisionError(f"cannot read {target.config_path}: {exc}", exit_code=2) from None
    if not isinstance(data, dict):
        raise ProvisionError(f"{target.config_path} is not a YAML mapping", exit_code=2)
    section = dict(data.get("kubernetes") or {})
    for key in LOCAL_ONLY_KEYS:
        section.pop(key, None)
    section["image"] = source.image
    if source.kind == "bundle":
        section["workdir"] = PROJECT_DIR  # the agent's code is the shipped project's
    section["namespace"] = namespace
    # The deployed gateway, whatever agl.yaml says: a gateway_url for the laptop means nothing inside the cluster.
    section["gateway_url"] = names.gateway_url(namespace)
    section["labels"] = {**(section.get("labels") or {}), LABEL_TRAIN: names.train}
    section["project"] = {"config_map": names.config, "items": items, "mount_path": PROJECT_DIR}
    data["runner"] = "kubernetes"
    data["kubernetes"] = section
    header = (f"# The cluster's copy of {target.config_path.name} for train {names.train!r}, written by "
              "`agl train --on kubernetes`.\n# Edit the original and re-run that command: this copy is replaced.\n")
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
